"""The sections across runs: RQ3 (layouts), RQ4 (cache pressure: KV capacity and concurrency) and
RQ5 (sharing modes), plus the short labels and the groups of settings runs differ in."""

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvscope.analysis import across_runs
from kvscope.analysis.run import RunAnalysis
from kvscope.records.run_dir import run_name
from kvscope.report import plots
from kvscope.report.columns import COLUMNS
from kvscope.report.prose import say
from kvscope.report.table import Section, table

# Settings that change what a run measures besides KV capacity and concurrency: runs that differ
# in one are not compared along the pressure axes (RQ4).
GROUP_KEYS = (
    "engine.kind",
    "engine.model",
    "engine.prefix_cache",
    "engine.eviction_policy",
    "engine.page_size",
    "engine.hierarchical_cache",
    "engine.context_length",
    "workload.mode",
    "workload.loop",
    "workload.cycles",
    "workload.max_cycles",
    "workload.layout",
    "workload.sharing",
    "workload.max_tokens",
    "workload.tool",
    "workload.synthetic",
)
VARIES = {"rq3": "prompt layout", "rq4": "KV capacity or concurrency", "rq5": "sharing mode"}


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """Short, unique labels: run names without their time stamp and the prefix they share."""
    names = [p.name for p in run_dirs]
    short = [run_name(n) for n in names]
    if len(short) > 1:
        common = os.path.commonprefix(short)  # noqa: RUF071 (by character: intended)
        common = common[: common.rfind("-") + 1] if "-" in common else ""
        if all(len(n) > len(common) for n in short):
            short = [n[len(common) :] for n in short]
    if len(set(short)) < len(short):
        short = names
    return [n if short.count(n) == 1 else f"{n} ({i + 1})" for i, n in enumerate(short)]


def sweep_groups(data: Sequence[RunAnalysis]) -> list[str | None]:
    """Per run, the GROUP_KEYS settings in which the runs differ ("layout=role-first"); None for
    every run when they differ in none. A setting a run's config lacks (recorded before the
    setting existed) is not held against it: only two different recorded values differ."""

    def setting(d: RunAnalysis, key: str) -> str | None:
        section, name = key.split(".")
        values = d.config.get(section) or {}
        return json.dumps(values[name], sort_keys=True) if name in values else None

    differ = [k for k in GROUP_KEYS if len({setting(d, k) for d in data} - {None}) > 1]
    if not differ:
        return [None] * len(data)
    return [
        ", ".join(
            f"{k.split('.')[1]}={json.loads(v)}" for k in differ if (v := setting(d, k)) is not None
        )
        for d in data
    ]


def cross_run_sections(data: Sequence[RunAnalysis]) -> list[Section]:
    """RQ3, RQ4 and RQ5; those whose variable differs between the runs come first, with their
    tables; the others are one sentence each (a table of identical settings answers nothing)."""
    by_label = {d.label: d.requests for d in data}
    capacities = {d.kv_capacity_config for d in data}
    concurrency = {d.concurrency for d in data}
    varied = {
        "rq3": len({_workload(d, "layout") for d in data}) > 1,
        "rq4": len(capacities) > 1 or len(concurrency) > 1,
        "rq5": len({_workload(d, "sharing") or "documents" for d in data}) > 1,
    }
    sections = [
        rq3(by_label),
        rq4(data, len(capacities) > 1, len(concurrency) > 1),
        rq5(by_label),
    ]
    sections = [
        s if varied[s.key] else Section(s.key, s.title, say("not_varied", VARIES[s.key]))
        for s in sections
    ]
    return sorted(sections, key=lambda s: not varied[s.key])


def rq3(by_label: dict[str, Any]) -> Section:
    cols = COLUMNS["rq3"]
    layout = across_runs.layout_comparison(by_label)
    return Section(
        "rq3",
        "RQ3: prompt layout",
        say("rq3_intro"),
        tables=[table(layout, cols, "per run and agent", drop_null=True)],
    )


def rq4(data: Sequence[RunAnalysis], by_capacity: bool, by_concurrency: bool) -> Section:
    params = [
        (
            {
                "run": d.label,
                "kv_capacity_tokens": d.kv_capacity,
                "concurrency": d.concurrency,
                "group": group,
            },
            d.requests,
        )
        for d, group in zip(data, sweep_groups(data), strict=True)
    ]
    sweep = across_runs.pressure_sweep(params)
    losses = across_runs.first_to_lose_reuse(sweep) if by_capacity else []
    notes = [say("capacity_loss", loss, across_runs.LOSS_THRESHOLD) for loss in losses]
    if by_capacity and not losses:
        notes.append(say("no_capacity_loss", across_runs.LOSS_THRESHOLD))
    if by_concurrency:
        notes += [
            say("concurrency_loss", loss)
            for loss in across_runs.first_to_lose_reuse(sweep, axis="concurrency")
        ]
    cols = COLUMNS["rq4"]
    return Section(
        "rq4",
        "RQ4: cache pressure",
        say("rq4_intro"),
        plots.capacity_lines(sweep, losses, across_runs.runs_order(d.requests for d in data))
        if by_capacity
        else None,
        say("rq4_missing"),
        [table(sweep, cols, "per run and agent", drop_null=True)],
        notes,
    )


def rq5(by_label: dict[str, Any]) -> Section:
    sharing = across_runs.sharing_comparison(by_label)
    cols = COLUMNS["rq5"]
    return Section(
        "rq5",
        "RQ5: sharing modes",
        say("rq5_intro"),
        tables=[table(sharing, cols, "per mode, run and agent", drop_null=True)],
    )


def _workload(data: RunAnalysis, key: str) -> Any:
    return (data.config.get("workload") or {}).get(key)
