"""Fidelity: the replay under the engine's own policy at the run's capacity, against the cached
tokens the engine measured, request by request.

`fidelity(source, result)` compares the requests whose cached tokens were measured:
`exact_share` = share with simulated == measured; `weighted_difference` =
sum|simulated - measured| / sum(measured) (None when nothing was measured as cached and the
replay differs). Targets: exact_share >= EXACT_TARGET and weighted_difference <= DIFF_TARGET.

Each differing request gets the causes found for it (`reasons`): preempted in the replay, ran
while other requests were running (timing: the engine's interleaving of their steps is not in
the trace), token ids that do not count its prompt_tokens, calls left out of the replay (failed,
or without token ids) that began before it (their blocks were in the engine's cache only).
A difference with none of these is "no cause in the trace" (the simulator's rule or capacity
differs from the engine's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvscope.sim.caches.result import SimResult
from kvscope.sim.inputs.sources import Source

EXACT_TARGET = 0.99
DIFF_TARGET = 0.01
NO_CAUSE = "no cause in the trace: the simulator's rule or capacity differs from the engine's"


@dataclass(frozen=True)
class Mismatch:
    request_id: str
    agent: str | None
    measured: int
    simulated: int
    reasons: list[str]


@dataclass(frozen=True)
class Fidelity:
    policy: str
    capacity_tokens: int
    compared: int  # requests with measured cached tokens
    not_measured: int  # requests in the trace without them
    exact: int
    exact_share: float | None
    weighted_difference: float | None
    measured_tokens: int
    simulated_tokens: int
    mismatches: list[Mismatch] = field(default_factory=list)
    excluded: dict[str, int] = field(default_factory=dict)  # calls left out of the trace

    @property
    def meets_targets(self) -> bool:
        return (
            self.exact_share is not None
            and self.weighted_difference is not None
            and self.exact_share >= EXACT_TARGET
            and self.weighted_difference <= DIFF_TARGET
        )

    def causes(self) -> dict[str, int]:
        """How many differing requests each cause was found for."""
        out: dict[str, int] = {}
        for m in self.mismatches:
            for r in m.reasons:
                key = r.split(" (", 1)[0]
                out[key] = out.get(key, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "capacity_tokens": self.capacity_tokens,
            "compared": self.compared,
            "not_measured": self.not_measured,
            "exact": self.exact,
            "exact_share": self.exact_share,
            "weighted_difference": self.weighted_difference,
            "measured_tokens": self.measured_tokens,
            "simulated_tokens": self.simulated_tokens,
            "meets_targets": self.meets_targets,
            "targets": {"exact_share": EXACT_TARGET, "weighted_difference": DIFF_TARGET},
            "causes": self.causes(),
            "excluded": self.excluded,
            "mismatches": [m.__dict__ for m in self.mismatches],
        }


def overlaps(start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per request, how many other requests ran at some moment of its [start, end)."""
    starts, ends = np.sort(start), np.sort(end)
    began_before_my_end = np.searchsorted(starts, end, side="left")
    ended_by_my_start = np.searchsorted(ends, start, side="right")
    busy = began_before_my_end - ended_by_my_start - (end > start)
    return np.maximum(busy, 0)


def nearest_start_gap(start: np.ndarray) -> np.ndarray:
    """Per request, seconds to the closest start of another request (inf when alone): the
    engine may take near-simultaneous requests in another order than the trace's clocks."""
    if len(start) < 2:
        return np.full(len(start), np.inf)
    order = np.argsort(start, kind="stable")
    gaps = np.diff(start[order])
    near = np.minimum(np.r_[np.inf, gaps], np.r_[gaps, np.inf])
    out = np.empty(len(start))
    out[order] = near
    return out


def fidelity(source: Source, result: SimResult) -> Fidelity | None:
    """The replay `result` against the engine's measurements; None when the trace has none."""
    trace = source.trace
    measured = trace.measured_cached_tokens
    if measured is None:
        return None
    known = ~np.isnan(measured)
    simulated = np.minimum(result.cached_tokens, trace.prompt_tokens).astype(np.int64)
    m = measured[known].astype(np.int64)
    s = simulated[known]
    total = int(m.sum())
    diff = int(np.abs(s - m).sum())
    busy = overlaps(trace.start_s, trace.end_s)
    left_out = source.excluded_start_s
    before = (
        np.zeros(len(trace), dtype=np.int64)
        if left_out is None
        else np.searchsorted(left_out, trace.start_s, side="left")
    )
    nearest = nearest_start_gap(trace.start_s)
    mismatches = []
    for i in np.flatnonzero(known & (simulated != np.nan_to_num(measured, nan=-1))):
        reasons = []
        if result.preempted[i]:
            reasons.append("preempted in the replay (the pool was pinned by running requests)")
        if busy[i]:
            reasons.append(
                f"timing (overlapped {int(busy[i])} other requests in time; the nearest start "
                f"{1e3 * nearest[i]:.1f} ms apart)"
            )
        if source.id_mismatch is not None and source.id_mismatch[i]:
            reasons.append("token ids mismatched (their count differs from prompt_tokens)")
        if before[i]:
            reasons.append(
                f"left-out calls ran before it ({int(before[i])} failed or without token ids: "
                "their blocks are not replayed)"
            )
        mismatches.append(
            Mismatch(
                trace.request_ids[i],
                trace.agents[i],
                int(measured[i]),
                int(simulated[i]),
                reasons or [NO_CAUSE],
            )
        )
    compared = int(known.sum())
    return Fidelity(
        policy=result.policy,
        capacity_tokens=result.capacity_blocks * result.block_size,
        compared=compared,
        not_measured=len(trace) - compared,
        exact=compared - len(mismatches),
        exact_share=(compared - len(mismatches)) / compared if compared else None,
        weighted_difference=diff / total if total else (0.0 if diff == 0 and compared else None),
        measured_tokens=total,
        simulated_tokens=int(s.sum()),
        mismatches=mismatches,
        excluded=dict(source.excluded),
    )
