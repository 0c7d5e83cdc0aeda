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


def _add(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a + b


def per_agent_server(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, float | None]]:
    """agent -> {prompt_tokens, cached_tokens, ttft_mean_ms, e2e_mean_ms} from the /metrics series
    rows (metrics.parquet); empty when the engine labels nothing by agent (vLLM).

    An agent with no cached_tokens series has 0 cached tokens only where the engine exported the
    counter for some agent (SGLang creates a label set at its first hit); an engine that never
    exported it leaves cached_tokens None. A value none of whose samples is known is None.
    """
    exported: set[str] = set()

    def key(row: Mapping[str, Any]) -> tuple[str, str, str] | None:
        part = _part(row)
        if part is None:
            return None
        exported.add(row["kvscope_name"])
        return row["kvscope_name"], part, row["labels"]

    deltas: dict[str, dict[tuple[str, str], float | None]] = defaultdict(dict)
    for (name, part, labels), delta in series_deltas(rows, key).items():
        agent = json.loads(labels).get(AGENT_LABEL)
        if agent:
            deltas[agent][(name, part)] = _add(deltas[agent].get((name, part), 0.0), delta)
    out: dict[str, dict[str, float | None]] = {}
    for agent, parts in deltas.items():
        view = {COUNTERS[name]: v for (name, part), v in parts.items() if part == "total"}
        if "prompt_tokens" in view and "cached_tokens" not in view:
            view["cached_tokens"] = 0.0 if "cached_tokens_total" in exported else None
        for name, column in LATENCIES.items():
            count, total = parts.get((name, "count")), parts.get((name, "sum"))
            if count and total is not None:
                view[column] = total / count * 1000
        out[agent] = view
    return out
