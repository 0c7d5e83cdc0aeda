"""The engine's own per-agent view: SGLang's tokenizer metrics labelled `agent` (kvscope sends the
agent as the x-custom-labels header), over the run, to set beside the client's per-agent numbers."""

import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from kvscope.collect.series import histogram_part, series_deltas
from kvscope.engines.sglang import AGENT_LABEL

COUNTERS = {"prompt_tokens_total": "prompt_tokens", "cached_tokens_total": "cached_tokens"}
LATENCIES = {"ttft_seconds": "ttft_mean_ms", "e2e_seconds": "e2e_mean_ms"}


def _part(row: Mapping[str, Any]) -> str | None:
    name, metric = row.get("kvscope_name"), row["metric_name"]
    if name in COUNTERS:
        return "total"
    return histogram_part(metric) if name in LATENCIES else None


def per_agent_server(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """agent -> {prompt_tokens, cached_tokens, ttft_mean_ms, e2e_mean_ms} from the /metrics series
    rows (metrics.parquet); empty when the engine labels nothing by agent (vLLM)."""

    def key(row: Mapping[str, Any]) -> tuple[str, str, str] | None:
        part = _part(row)
        return None if part is None else (row["kvscope_name"], part, row["labels"])

    deltas: dict[str, dict[tuple[str, str], float]] = defaultdict(lambda: defaultdict(float))
    for (name, part, labels), delta in series_deltas(rows, key).items():
        agent = json.loads(labels).get(AGENT_LABEL)
        if agent:
            deltas[agent][(name, part)] += delta
    out: dict[str, dict[str, float]] = {}
    for agent, parts in deltas.items():
        view = {COUNTERS[name]: v for (name, part), v in parts.items() if part == "total"}
        if "prompt_tokens" in view:
            # SGLang creates cached_tokens_total{agent} at the agent's first hit: none yet is 0.
            view.setdefault("cached_tokens", 0.0)
        for name, column in LATENCIES.items():
            count = parts.get((name, "count"))
            if count:
                view[column] = parts[(name, "sum")] / count * 1000
        out[agent] = view
    return out
