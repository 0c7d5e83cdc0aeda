"""Live replay pacing (live/pacing.py) on hand-made timelines."""

import pytest

from kvscope.errors import KvscopeError
from kvscope.live.pacing import Timing, fire_time, schedule


def test_session_chain_keeps_recorded_gaps() -> None:
    # one workflow: a 0-2, b 3-5 (1 s tool time), c 5.5-6
    t = schedule("session", ["w", "w", "w"], [0.0, 3.0, 5.5], [2.0, 5.0, 6.0])
    assert t[0] == Timing(0, 0.0)
    assert t[1] == Timing(1, None, ((0, 1.0),))
    assert t[2] == Timing(2, None, ((1, 0.5),))
    # the replay's own completions set the clock: b fires 1 s after a completed
    assert fire_time(t[1], 100.0, {0: 110.0}) == 111.0


def test_session_workflows_are_independent_and_start_at_their_offsets() -> None:
    t = schedule("session", ["w1", "w2", "w1", "w2"], [10.0, 12.0, 14.0, 15.0],
                 [13.0, 14.5, 16.0, 17.0])  # fmt: skip
    assert t[0] == Timing(0, 0.0)
    assert t[1] == Timing(1, 2.0)  # w2's first call: its recorded offset
    assert t[2] == Timing(2, None, ((0, 1.0),))
    assert t[3] == Timing(3, None, ((1, 0.5),))


def test_session_fan_out_starts_together_and_join_waits_for_both() -> None:
    # planner 0-1; two researchers 1.2-3 and 1.25-4 (parallel); writer 4.5-5
    t = schedule("session", ["w"] * 4, [0.0, 1.2, 1.25, 4.5], [1.0, 3.0, 4.0, 5.0])
    assert t[1] == Timing(1, None, ((0, pytest.approx(0.2)),))
    assert t[2] == Timing(2, None, ((0, pytest.approx(0.25)),))
    assert t[3].offset_s is None
    assert dict(t[3].after) == {1: 1.5, 2: 0.5}  # both branches, each with its own gap
    # the branch that finished last in the replay decides
    assert fire_time(t[3], 0.0, {1: 10.0, 2: 9.0}) == 11.5


def test_session_negative_gap_is_zero_and_no_workflow_is_its_own() -> None:
    t = schedule("session", ["w", "w", None, None], [0.0, 2.0, 1.0, 1.5],
                 [2.0, 3.0, 5.0, 6.0])  # fmt: skip
    assert t[1] == Timing(1, None, ((0, 0.0),))
    assert t[2] == Timing(2, 1.0) and t[3] == Timing(3, 1.5)


def test_open_loop_uses_recorded_offsets_only() -> None:
    t = schedule("open-loop", ["w", "w"], [5.0, 9.0], [8.0, 10.0])
    assert t == [Timing(0, 0.0), Timing(1, 4.0)]
    assert fire_time(t[1], 100.0, {}) == 104.0


def test_unknown_pacing_and_empty() -> None:
    with pytest.raises(KvscopeError, match="unknown pacing"):
        schedule("closed", [], [], [])
    assert schedule("session", [], [], []) == []


def test_session_queued_workflow_takes_the_slot_an_ended_one_freed() -> None:
    # concurrency 2: w1 and w2 start at 0; w3 starts when w2 ends (4.0); w4 when w1 ends (6.0)
    workflows = ["w1", "w2", "w1", "w3", "w4", "w3"]
    start = [0.0, 0.1, 3.0, 4.01, 6.02, 7.0]
    end = [2.0, 4.0, 6.0, 5.0, 8.0, 9.0]
    t = schedule("session", workflows, start, end)
    assert t[0] == Timing(0, 0.0) and t[1] == Timing(1, pytest.approx(0.1))
    assert t[3].offset_s is None and t[3].after == ((1, pytest.approx(0.01)),)
    assert t[4].offset_s is None and t[4].after == ((2, pytest.approx(0.02)),)
    assert t[5].after == ((3, 2.0),)  # w3's own chain
    # calls without a workflow are never queued
    assert schedule("session", [None, None], [0.0, 5.0], [1.0, 6.0])[1] == Timing(1, 5.0)
