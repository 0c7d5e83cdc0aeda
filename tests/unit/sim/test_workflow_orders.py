"""sim/orders/workflow.py: the agent-group orders evict many blocks at once as one at a time."""

from __future__ import annotations

import numpy as np
import pytest
from sim_helpers import random_trace

from kvscope.sim import simulate as sim
from kvscope.sim.orders.workflow import PredictedNextAgentOrder, StepsToExecutionOrder


def _one_at_a_time(base: type) -> type:
    """`base` evicting by its `pop`, a search of the groups per block (the reference)."""

    class OneAtATime(base):  # type: ignore[misc, valid-type]
        def pop_many(self, m: int) -> list[int]:
            return [self.pop() for _ in range(m)]

    return OneAtATime


def _counted(base: type, batches: list[int]) -> type:
    """`base` as it is, noting how many victims each pop_many was asked for."""

    class Counted(base):  # type: ignore[misc, valid-type]
        def pop_many(self, m: int) -> list[int]:
            batches.append(m)
            return super().pop_many(m)

    return Counted


@pytest.mark.parametrize(
    ("policy", "base"),
    [
        ("steps-to-execution", StepsToExecutionOrder),
        ("predicted-next-agent", PredictedNextAgentOrder),
    ],
)
@pytest.mark.parametrize("seed", range(6))
def test_many_victims_at_once_are_the_victims_one_at_a_time(
    monkeypatch: pytest.MonkeyPatch, policy: str, base: type, seed: int
) -> None:
    trace = random_trace(seed, n=150)
    batches: list[int] = []
    for capacity in (6, 12, 25):
        monkeypatch.setitem(sim.ORDERS, policy, _counted(base, batches))
        fast = sim.simulate(trace, policy, capacity, compiled=False)
        monkeypatch.setitem(sim.ORDERS, policy, _one_at_a_time(base))
        slow = sim.simulate(trace, policy, capacity, compiled=False)
        assert fast.evictions == slow.evictions > 0
        for name in ("cached_blocks", "preempted", "harm_request", "harm_evictor", "harm_owner",
                     "harm_blocks"):  # fmt: skip
            assert np.array_equal(getattr(fast, name), getattr(slow, name)), (capacity, name)
    assert max(batches) > 1  # several victims were taken at once
