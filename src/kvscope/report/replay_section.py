"""The what-if replay's views: tables (terminal and report.html) and the hit-ratio plot.

Built from a replay document (`kvscope replay` writes it as RUN/replay.json):
{source, kind, block_size, fit, notes, fidelity, results: [sim.results.summary.Summary.to_dict()]}.
`replay_sections(doc)` -> the Sections that both `print_section` and the HTML template draw;
`replay_plot(results, run_capacity)` -> hit ratio vs capacity per policy (left) and per agent
(right), the run's capacity marked, as a data URI; `replay_section(run_dir)` -> the report's
sections, or [] when the run has no replay.json.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvscope.report.table import NULL, Section, Table, facts, fmt

MAX_MISMATCH_ROWS = 20
_STYLES = ("-", "--", ":", "-.")


def _ratio(prompt_tokens: int, cached_tokens: int) -> float | None:
    return cached_tokens / prompt_tokens if prompt_tokens else None


def _label(r: dict[str, Any]) -> str:
    return f"{r['policy']} @ {r['capacity_tokens']:,}"


def replay_plot(results: Sequence[dict[str, Any]], run_capacity: int | None = None) -> str | None:
    """Hit ratio vs capacity tokens: per policy, and per agent (colour) and policy (line style);
    a dotted vertical line at `run_capacity` (the run's own KV capacity) when given."""
    if not results:
        return None
    import matplotlib.pyplot as plt  # here: a terminal replay draws nothing (0.3 s of imports)

    from kvscope.report import plots

    policies = list(dict.fromkeys(r["policy"] for r in results))
    agents = list(dict.fromkeys(a for r in results for a in r["per_agent"]))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for policy in policies:
        rows = sorted(
            (r for r in results if r["policy"] == policy), key=lambda r: r["capacity_tokens"]
        )
        caps = [r["capacity_tokens"] for r in rows]
        hits = [float("nan") if r["hit_ratio"] is None else r["hit_ratio"] for r in rows]
        left.plot(caps, hits, marker="o", label=policy)  # null stays a gap, never 0
        style = _STYLES[policies.index(policy) % len(_STYLES)]
        for agent in agents:
            ys = [
                _ratio(**r["per_agent"][agent]) if agent in r["per_agent"] else None for r in rows
            ]
            right.plot(
                caps,
                [float("nan") if y is None else y for y in ys],
                marker=".",
                linestyle=style,
                color=plots.color(agent, agents),
                label=f"{agent} ({policy})",
            )
    for ax, title in ((left, "per policy"), (right, "per agent")):
        if run_capacity:
            ax.axvline(run_capacity, color="grey", linestyle=":", label="run's capacity")
        ax.set_xlabel("KV capacity (tokens)")
        ax.set_title(f"token-weighted hit ratio, {title}")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    left.set_ylabel("hit ratio")
    fig.tight_layout()
    return plots.data_uri(fig)


def _results_table(results: Sequence[dict[str, Any]]) -> Table:
    heads = [
        "policy",
        "capacity (tokens)",
        "blocks",
        "hit ratio",
        "cached tokens",
        "recompute tokens",
        "evictions",
        "preempted",
        "TTFT saved (ms)",
        "seconds",
    ]
    rows = [
        [
            r["policy"],
            fmt(r["capacity_tokens"], "int"),
            fmt(r["capacity_blocks"], "int"),
            fmt(r["hit_ratio"], "ratio"),
            fmt(r["cached_tokens"], "int"),
            fmt(r["recompute_tokens"], "int"),
            fmt(r["evictions"], "int"),
            fmt(r["preempted"], "int"),
            fmt(r["ttft_saved_ms"], "ms"),
            f"{r['seconds']:.3f}",
        ]
        for r in results
    ]
    return Table("per policy and capacity", heads, rows, text=[True] + [False] * 9)


def _grouped_table(results: Sequence[dict[str, Any]], key: str, title: str, head: str) -> Table:
    names = list(dict.fromkeys(n for r in results for n in r[key]))
    rows = []
    for name in names:
        prompt = next(r[key][name]["prompt_tokens"] for r in results if name in r[key])
        cells = [fmt(_ratio(**r[key][name]) if name in r[key] else None, "ratio") for r in results]
        rows.append([name, fmt(prompt, "int"), *cells])
    heads = [head, "prompt tokens", *(_label(r) for r in results)]
    return Table(
        title, heads, rows, "token-weighted hit ratio", [True] + [False] * (len(heads) - 1)
    )


def _harm_table(results: Sequence[dict[str, Any]]) -> Table | None:
    """Harm rows of every replay; None when no replay had one (a note says so instead)."""
    rows = [
        [
            _label(r),
            f"{h['evictor_agent']} -> {h['victim_agent']}",
            fmt(h["blocks"], "int"),
            fmt(h["tokens"], "int"),
        ]
        for r in results
        for h in r["harm"] or []
    ]
    if not rows:
        return None
    return Table(
        "harmful evictions: evictor agent -> victim agent",
        ["replay", "evictor -> victim", "blocks", "recomputed tokens"],
        rows,
        "blocks recomputed because the evictor's allocation evicted what the victim stored",
        [True, True, False, False],
    )


def _tier_table(results: Sequence[dict[str, Any]]) -> Table | None:
    """Per replay with a host tier and per agent: device / host / prefetched / missed tokens."""
    rows = [
        [
            _label(r),
            agent,
            *(fmt(t[k], "int") for k in ("device_tokens", "host_tokens", "prefetched_tokens")),
            fmt(t["missed_tokens"], "int"),
            fmt(t["load_ms"], "ms"),
        ]
        for r in results
        if r.get("tiers")
        for agent, t in r["tiers"]["per_agent"].items()
    ]
    if not rows:
        return None
    return Table(
        "two tiers: where each agent's prompt tokens came from",
        ["replay", "agent", "device", "host", "of which prefetched", "missed", "load ms"],
        rows,
        "host hits are loaded instead of recomputed; prefetched ones before the call",
        [True, True, False, False, False, False, False],
    )


def fidelity_section(fid: dict[str, Any] | None) -> Section:
    """The replay under the engine's own policy at the run's capacity vs the measured tokens."""
    title = "Replay fidelity (engine's own policy, run's capacity, vs measured)"
    if fid is None:
        return Section(
            "replay-fidelity",
            title,
            "",
            notes=[
                "no fidelity: nothing measured to "
                "compare with (a trace, or the engine's policy is not simulated)"
            ],
        )
    verdict = "meets" if fid["meets_targets"] else "misses"
    pairs = [
        ("policy @ capacity", f"{fid['policy']} @ {fid['capacity_tokens']:,} tokens"),
        ("requests compared", f"{fid['compared']} ({fid['not_measured']} without a measurement)"),
        (
            "exact",
            f"{fid['exact']} ({fmt(fid['exact_share'], 'ratio')}; target >= "
            f"{fid['targets']['exact_share']:.0%})",
        ),
        (
            "weighted difference",
            f"{fmt(fid['weighted_difference'], 'ratio')} (target <= "
            f"{fid['targets']['weighted_difference']:.0%})",
        ),
        (
            "cached tokens measured / replayed",
            f"{fid['measured_tokens']:,} / {fid['simulated_tokens']:,}",
        ),
    ]
    notes = [f"the replay {verdict} the fidelity targets"]
    notes += [f"{n} differing requests: {cause}" for cause, n in fid["causes"].items()]
    notes += [f"left out of the replay: {n} calls ({why})" for why, n in fid["excluded"].items()]
    tables = [facts("", pairs)]
    if fid["mismatches"]:
        shown = fid["mismatches"][:MAX_MISMATCH_ROWS]
        rows = [
            [
                m["request_id"][:12],
                m["agent"] or NULL,
                fmt(m["measured"], "int"),
                fmt(m["simulated"], "int"),
                "; ".join(m["reasons"]),
            ]
            for m in shown
        ]
        more = len(fid["mismatches"]) - len(shown)
        tables.append(
            Table(
                "differing requests",
                ["request", "agent", "measured", "replayed", "why"],
                rows,
                f"{more} more in replay.json" if more else "",
                [True, True, False, False, True],
            )
        )
    return Section("replay-fidelity", title, "", tables=tables, notes=notes)


def replay_sections(doc: dict[str, Any], image: str | None = None) -> list[Section]:
    """The replay's tables (and plot) as Sections: results, then fidelity."""
    results = doc["results"]
    fit = doc.get("fit")
    notes = [
        f"{doc.get('kind')} {doc.get('source')}: {doc.get('requests')} requests, "
        f"block size {doc.get('block_size')}",
        *(doc.get("notes") or []),
    ]
    notes.append(
        "TTFT saved: the fitted prefill cost "
        f"({fit['ms_per_token']:.3f} ms/token on {fit['fit_on']}, {fit['rows']} calls) times "
        "the cached tokens gained over the run's measured ones"
        if fit
        else "TTFT saved: null (no prefill cost could be fitted from the source)"
    )
    harm, tiers = _harm_table(results), _tier_table(results)
    if harm is None and all(r["harm"] is not None for r in results):
        notes.append("harmful evictions: none in any replay")
    main = Section(
        "replay",
        "What-if replay: hit ratio per policy and capacity",
        "Each policy replayed over the same requests at each KV capacity (kvscope replay).",
        image,
        "no replay plot",
        [
            _results_table(results),
            _grouped_table(results, "per_agent", "per agent", "agent"),
            _grouped_table(results, "per_transition", "per transition", "transition"),
            *([harm] if harm else []),
            *([tiers] if tiers else []),
        ],
        notes,
    )
    return [main, fidelity_section(doc.get("fidelity"))] if doc.get("kind") == "run" else [main]


def replay_section(run_dir: Path) -> list[Section]:
    """The report's replay sections from RUN/replay.json (+ replay.png), if the run has one."""
    from kvscope.records.run_dir import REPLAY_JSON, REPLAY_PNG  # pyarrow: not for a trace's replay

    path = run_dir / REPLAY_JSON
    if not path.exists():
        return []
    doc = json.loads(path.read_text())
    png = run_dir / REPLAY_PNG
    from kvscope.report import plots

    return replay_sections(
        doc,
        plots.file_uri(png)
        if png.exists()
        else replay_plot(doc["results"], doc.get("run_capacity_tokens")),
    )
