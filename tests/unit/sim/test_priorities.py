"""SGLang's priority eviction in the replay: the priorities a run's calls carried (its request
table's engine_priority) replayed by `priority` and `priority-hints`, and eviction hints
computed offline (`steps-to-execution-hints`, `predicted-next-hints`) as the probe sends them."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import ROOT
from sim_helpers import make_trace, random_trace

from kvscope.errors import KvscopeError
from kvscope.live.compare import subset
from kvscope.probe.hints import make_hints
from kvscope.probe.identity import CallIdentity
from kvscope.sim.hints import offline_priorities
from kvscope.sim.inputs.convert import write_jsonl
from kvscope.sim.inputs.sources import Source, load_source
from kvscope.sim.plan import make_plan, run_plan
from kvscope.sim.simulate import POLICIES, simulate
from kvscope.sim.trace import Trace

SGLANG_RUN = ROOT / "tests" / "fixtures" / "replay" / "pathology-sglang"
PEER = ["planner", "executor", "expresser", "reviewer"]
CYCLES = 3


def cyclic() -> Trace:
    """PEER's four agents in a strict cycle, one workflow, one call at a time: each agent's own
    prefix of 2 blocks (one SGLang node), 3 pages while it runs (its partial page included)."""
    agents = PEER * CYCLES
    previous = [None, *agents[:-1]]
    blocks = [[10 * (PEER.index(a) + 1), 10 * (PEER.index(a) + 1) + 1] for a in agents]
    return make_trace(blocks, agents=agents, previous=previous, workflows=["w1"] * len(agents))


# 8 pages: three cached prefixes (6) and a running call's 2 free pages: a fourth prefix evicts
CAPACITY = 8


def test_recorded_priorities_keep_the_top_ranked_prefixes_where_lru_cycles() -> None:
    trace = cyclic()
    assert trace.priorities is None
    lru = simulate(trace, "lru", CAPACITY, engine="sglang").cached_blocks
    # LRU: the least recent prefix is always the one needed next: every call misses
    assert list(lru) == [0] * 12
    assert list(simulate(trace, "priority", CAPACITY, engine="sglang").cached_blocks) == [0] * 12
    ranked = replace(trace, priorities=np.array([8, 6, 4, 2] * CYCLES, dtype=np.int64))
    # By hand: the reviewer's call evicts the expresser (4, the lowest of 8, 6, 4); from the
    # second cycle on the planner and executor hit their 2 blocks, the expresser evicts the
    # reviewer (2) and the reviewer the expresser (4).
    expected = [0, 0, 0, 0] + [2, 2, 0, 0] * (CYCLES - 1)
    for policy in ("priority", "priority-hints"):
        result = simulate(ranked, policy, CAPACITY, engine="sglang")
        assert list(result.cached_blocks) == expected and result.policy == policy
    # explicit priorities still win over the trace's
    zeros = np.zeros(len(trace))
    assert not simulate(
        ranked, "priority", CAPACITY, engine="sglang", priorities=zeros
    ).cached_blocks.any()


def test_offline_hints_rank_a_strict_cycle_by_first_appearance() -> None:
    trace = cyclic()
    for policy in ("steps-to-execution-hints", "predicted-next-hints"):
        result = simulate(trace, policy, CAPACITY, engine="sglang")
        assert list(result.cached_blocks) == [0, 0, 0, 0] + [2, 2, 0, 0] * (CYCLES - 1)


@pytest.mark.parametrize(
    ("policy", "level_policy"),
    [
        ("steps-to-execution-hints", "steps-to-execution"),
        ("predicted-next-hints", "predicted-next"),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_offline_hints_are_the_probes_on_the_same_calls(
    policy: str, level_policy: str, seed: int
) -> None:
    trace = random_trace(seed, n=80)  # four workflows interleaved, gaps of ~1 s
    idle_s = 2.0  # short: workflows drop out of flight and come back
    now = [0.0]
    hints = make_hints(level_policy, idle_s=idle_s, clock=lambda: now[0])  # type: ignore[arg-type]
    assert hints is not None
    sent = np.zeros(len(trace), dtype=np.int64)
    for i in np.argsort(trace.start_s, kind="stable"):
        now[0] = float(trace.start_s[i])
        ident = CallIdentity(
            agent_id=trace.agents[i],
            previous_agent_id=trace.previous_agents[i],
            workflow_run_id=trace.workflows[i],
        )
        sent[i] = hints(ident)
    offline = offline_priorities(trace, level_policy, idle_s)
    assert list(offline) == list(sent) and len(set(sent)) > 1
    replayed = simulate(trace, policy, 20, engine="sglang").cached_blocks
    recorded = replace(trace, priorities=offline_priorities(trace, level_policy))  # idle 120 s
    assert list(replayed) == list(simulate(recorded, "priority", 20, engine="sglang").cached_blocks)


def test_priority_hints_need_the_calls_priorities_and_sglang() -> None:
    trace = cyclic()
    assert {"priority-hints", "steps-to-execution-hints", "predicted-next-hints"} <= set(POLICIES)
    with pytest.raises(KvscopeError, match="this run's calls carried no engine priority: "
                       "profile it with eviction_hints"):  # fmt: skip
        simulate(trace, "priority-hints", CAPACITY, engine="sglang")
    ranked = replace(trace, priorities=np.ones(len(trace), dtype=np.int64))
    for policy in ("priority-hints", "steps-to-execution-hints"):
        with pytest.raises(KvscopeError, match="the vLLM block pool has no per-request priority"):
            simulate(ranked, policy, CAPACITY, engine="vllm")
        with pytest.raises(KvscopeError, match="vLLM block pool"):
            make_plan(Source("run", replace(ranked, engine="vllm")), [policy], ["32"])
    with pytest.raises(KvscopeError, match="carried no engine priority"):
        make_plan(Source("tokens", trace), ["priority-hints"], ["32"])


def test_a_trace_without_an_engine_replays_the_hints_on_sglang() -> None:
    source = Source("tokens", cyclic())
    plan = make_plan(source, ["steps-to-execution-hints"], ["32"])
    assert plan.engine is None and any("SGLang's radix cache" in n for n in plan.notes)
    (hints,) = run_plan(source, plan).summaries
    assert hints.cached_tokens == 2 * 2 * (CYCLES - 1) * 4  # the hand count above, in tokens


def _with_priorities(tmp_path: Path, by_agent: dict[str, int | None], policy: str) -> Path:
    run = shutil.copytree(SGLANG_RUN, tmp_path / "run")
    rows = [json.loads(line) for line in (run / "requests.jsonl").open()]
    for row in rows:
        row["engine_priority"] = by_agent.get(row["agent_id"])
    write_jsonl(rows, run / "requests.jsonl")
    info = json.loads((run / "run.json").read_text())
    info["config"]["engine"]["eviction_policy"] = policy
    (run / "run.json").write_text(json.dumps(info))
    return run


def test_a_run_directory_gives_the_priorities_its_calls_carried(tmp_path: Path) -> None:
    assert load_source(SGLANG_RUN).trace.priorities is None  # recorded before the column
    run = _with_priorities(tmp_path, {"planner": 8, "executor": 6}, "priority")
    source = load_source(run)
    trace = source.trace
    assert trace.engine == "sglang" and source.policy == "priority"
    expected = {"planner": 8, "executor": 6}
    assert trace.priorities is not None and trace.priorities.dtype == np.int64
    assert list(trace.priorities) == [expected.get(a or "", 0) for a in trace.agents]
    # the engine's own policy (fidelity's replay) is replayed with them
    plan = make_plan(source, [], [])
    # an SGLang run's defaults: what its radix cache runs (no KVFlow / PBKV pool orders)
    assert plan.policies == ["priority", "lru", "steps-to-execution-hints", "predicted-next-hints"]
    with pytest.raises(KvscopeError, match="'belady' is not simulated on SGLang's radix cache"):
        make_plan(source, ["belady"], [])
    assert any("carried an engine priority: `priority`" in n for n in plan.notes)
    outcome = run_plan(source, plan)
    cap = trace.capacity_tokens // trace.block_size
    own = simulate(trace, "priority", cap, engine="sglang", priorities=trace.priorities)
    assert outcome.fidelity is not None
    assert outcome.fidelity.simulated_tokens == int(
        np.minimum(own.cached_tokens, trace.prompt_tokens).sum()
    )
    # a live replay's subset keeps them
    picked = [3, 0, 5]
    assert list(subset(trace, picked).priorities) == [trace.priorities[i] for i in picked]


def test_a_run_whose_calls_carried_none_has_no_priorities(tmp_path: Path) -> None:
    source = load_source(_with_priorities(tmp_path, {}, "priority"))
    assert source.trace.priorities is None
    assert any("no call carried an engine priority" in n for n in make_plan(source, [], []).notes)
