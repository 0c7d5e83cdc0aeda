"""Next-agent predictability on hand-made tables with known answers: 3 agents, and 6 agents with a
fan-out (3 parallel branches) and a join."""

from typing import Any

import pytest
from request_tables import request, table

from kvscope.analysis.predictability import Accuracy, predictability
from kvscope.analysis.transitions import matrix, transitions
from kvscope.records.agents import agent_order

S = 1_000_000_000  # ns per second


def call(wf: str, agent: str, turn: int, start_s: float, end_s: float, prev: str | None = None):
    """One call of `agent`'s `turn`-th visit in workflow `wf`, from start_s to end_s seconds."""
    return request(
        workflow_run_id=wf, thread_id=wf, agent_id=agent, turn_id=turn,
        previous_agent_id=prev, start_ns=int(start_s * S), end_ns=int(end_s * S),
    )  # fmt: skip


def three_agents() -> list[dict[str, Any]]:
    """w1, w2: a b c a; w3: a c b (each call 1 s, 1 s apart; workflows 100 s apart)."""
    rows = []
    for n, seq in enumerate(("abca", "abca", "acb")):
        wf, prev, turns = f"w{n + 1}", None, {}
        for i, agent in enumerate(seq):
            turns[agent] = turns.get(agent, 0) + 1
            t = 100 * n + 2 * i
            rows.append(call(wf, agent, turns[agent], t, t + 1, prev))
            prev = agent
    return rows


def fan_out(wf: str, t0: float, branch_starts: dict[str, float]) -> list[dict[str, Any]]:
    """router -> Send to 3 searches (parallel) -> writer (join) -> critic -> writer -> critic."""
    rows = [call(wf, "router", 1, t0, t0 + 1)]
    ends = {"search_docs": 3, "search_code": 5, "search_web": 4}
    for agent, start in branch_starts.items():
        rows.append(call(wf, agent, 1, t0 + start, t0 + ends[agent], "router"))
    rows += [
        call(wf, "writer", 1, t0 + 6, t0 + 7, "search_code"),  # the join: one branch is named
        call(wf, "critic", 1, t0 + 8, t0 + 9, "writer"),
        call(wf, "writer", 2, t0 + 10, t0 + 11, "critic"),
        call(wf, "critic", 2, t0 + 12, t0 + 13, "writer"),
    ]
    return rows


def six_agents() -> list[dict[str, Any]]:
    """Two workflows whose branches start in different orders (a few ms apart)."""
    first = {"search_docs": 2.000, "search_code": 2.001, "search_web": 2.002}
    second = {"search_web": 2.000, "search_code": 2.001, "search_docs": 2.002}
    return fan_out("w1", 0, first) + fan_out("w2", 100, second)


def test_three_agents_sequences_and_reuse_distance() -> None:
    p = predictability(three_agents())
    assert p.workflows == 3
    assert p.distinct_sequences == 2
    assert [(s.sequence, s.workflows) for s in p.sequences] == [
        (("a", "b", "c", "a"), 2),
        (("a", "c", "b"), 1),
    ]
    reuse = {r.agent_id: r for r in p.reuse}
    assert list(reuse) == ["a", "b", "c"]
    a = reuse["a"]
    assert (a.visits, a.returns, a.no_return) == (5, 2, 3)
    assert a.steps == (3, 3) and a.steps_p50 == 3 and a.steps_max == 3
    assert a.seconds == (5.0, 5.0) and a.seconds_p95 == pytest.approx(5.0)
    b = reuse["b"]
    assert (b.visits, b.returns, b.steps_p50, b.seconds_max) == (3, 0, None, None)  # null, not 0
    # any workflow: a at 0-1, 6-7 | 100-101, 106-107 | 200-201; the last visit has none
    assert a.any_seconds == (5.0, 93.0, 5.0, 93.0) and a.any_seconds_p50 == pytest.approx(49)
    assert b.any_seconds == (102.0 - 3, 204.0 - 103)  # b at 2-3 | 102-103 | 204-205 (w3: a c b)


def test_three_agents_online_predictor() -> None:
    acc = {a.agent_id: a for a in predictability(three_agents()).accuracy}
    assert list(acc) == ["a", "b", "c", "all"]
    # w1 has nothing to learn from; w2 is all predicted right from w1; w3 (a c b) all wrong
    assert acc["all"] == Accuracy("all", 8, 5, 3 / 5, 3, 2 / 3, 1, 1.0)
    assert acc["a"] == Accuracy("a", 3, 2, 0.5, 2, 0.5, 1, 1.0)
    assert acc["b"] == Accuracy("b", 2, 1, 1.0, 1, 1.0, 0, None)
    assert acc["c"] == Accuracy("c", 3, 2, 0.5, 0, None, 0, None)


def test_nothing_to_predict_from_is_null() -> None:
    acc = predictability(three_agents()[:4]).accuracy  # w1 alone: no earlier workflow
    assert [a.agent_id for a in acc] == ["a", "b", "c", "all"]
    assert acc[-1] == Accuracy("all", 3, 0, None, 0, None, 0, None)


def test_history_two_backs_off_to_one() -> None:
    p = predictability(three_agents(), history=2)
    assert p.history == 2
    # with identical earlier sequences the longer context changes nothing on w2; on w3 "a c"
    # was never seen, so it backs off to "c" -> a (wrong, as with history 1)
    assert p.accuracy[-1] == Accuracy("all", 8, 5, 3 / 5, 3, 2 / 3, 1, 1.0)


def test_six_agents_fan_out_and_join_sequence() -> None:
    rows = six_agents()
    p = predictability(rows)
    want = ("router", "search_code", "search_docs", "search_web", "writer", "critic", "writer",
            "critic")  # fmt: skip
    assert [(s.sequence, s.workflows) for s in p.sequences] == [(want, 2)]  # branches by name
    branches = ("search_code", "search_docs", "search_web")
    assert p.edges == {
        ("start", "router"): 2,
        **{("router", b): 2 for b in branches},  # fan-out
        **{(b, "writer"): 2 for b in branches},  # join
        ("writer", "critic"): 4,
        ("critic", "writer"): 2,
    }
    reuse = {r.agent_id: r for r in p.reuse}
    assert list(reuse) == agent_order(rows) == [
        "router", "search_docs", "search_code", "search_web", "writer", "critic"
    ]  # fmt: skip
    assert reuse["writer"].steps == (2, 2) and reuse["writer"].seconds == (3.0, 3.0)
    assert reuse["critic"].steps == (2, 2) and reuse["critic"].no_return == 2
    assert reuse["router"].returns == 0


def test_six_agents_predictor_learns_the_fan_out() -> None:
    acc = {a.agent_id: a for a in predictability(six_agents()).accuracy}
    # w1: nothing learned; w2: the same sequence, every position predicted right
    assert acc["all"] == Accuracy("all", 14, 7, 1.0, 6, 1.0, 5, 1.0)
    assert acc["router"] == Accuracy("router", 2, 1, 1.0, 1, 1.0, 1, 1.0)
    assert acc["critic"] == Accuracy("critic", 2, 1, 1.0, 1, 1.0, 0, None)


def test_six_agents_transition_matrix_is_sized_to_what_ran() -> None:
    t = table(*six_agents())
    froms, tos, _ = matrix(transitions(t), "calls", order=agent_order(t.to_pylist()))
    assert tos == ["router", "search_docs", "search_code", "search_web", "writer", "critic"]
    assert froms == ["start", "router", "search_code", "writer", "critic"]


def test_longer_history_and_no_workflow() -> None:
    p = predictability(three_agents())
    assert p.longer == Accuracy("all, last 2", 8, 5, 3 / 5, 3, 2 / 3, 1, 1.0)
    empty = predictability([request(workflow_run_id=None, agent_id=None)])
    assert (empty.workflows, empty.distinct_sequences, empty.longer) == (0, 0, None)
    assert empty.accuracy == [] and empty.reuse == [] and empty.edges == {}


def test_calls_of_one_visit_are_one_position() -> None:
    rows = three_agents()[:4]  # w1: a b c a
    rows.insert(2, call("w1", "b", 1, 2.5, 2.9, "b"))  # b's visit makes a second call
    p = predictability(rows)
    assert p.sequences[0].sequence == ("a", "b", "c", "a")
    assert {r.agent_id: r.visits for r in p.reuse} == {"a": 2, "b": 1, "c": 1}


def test_six_agents_handoff_gaps_skip_running_branches() -> None:
    got = {
        (r["from_agent"], r["to_agent"]): r
        for r in transitions(table(*six_agents())).to_pylist()
        if r["kind"] == "handoff"
    }
    # a branch's gap is from the dispatcher's end, not from a sibling branch still running
    assert got[("router", "search_code")]["gap_ms_p50"] == pytest.approx(1001)
    assert got[("router", "search_web")]["calls"] == 2
    # the join: from the last branch to finish (search_code, at 5 s), 1 s before the writer
    assert got[("search_code", "writer")]["gap_ms_p50"] == pytest.approx(1000)
    assert got[("start", "router")]["gap_ms_p50"] is None


def test_analyses_and_views_know_no_workload() -> None:
    """Agent names come from what ran: analysis/, report/ and the analyze/sweep commands import
    nothing from the workload (whose PEER prompts name the PEER agents)."""
    from helpers import ROOT

    src = ROOT / "src" / "kvscope"
    files = [*(src / "analysis").glob("*.py"), *(src / "report").glob("*.py"),
             src / "cli" / "analyze.py", src / "cli" / "sweep.py"]  # fmt: skip
    assert [f.name for f in files if "kvscope.workload" in f.read_text()] == []


def test_six_agents_latency_gaps_run_from_the_dispatcher() -> None:
    from kvscope.analysis.latency import call_rows

    rows = call_rows(table(*six_agents())).to_pylist()
    other = {(r["workflow_run_id"], r["agent_id"], r["turn_id"]): r["other_ms"] for r in rows}
    assert other[("w1", "search_code", 1)] == pytest.approx(1001)  # not from search_docs (running)
    assert other[("w1", "writer", 1)] == pytest.approx(1000)  # the join: from the last branch
    assert other[("w1", "router", 1)] is None  # the workflow's first call has no gap


def _reference_accuracy(seqs: list[list[str]], history: int) -> dict[str, tuple]:
    """The predictor as first written (a Counter per context, max() per prediction): the
    oracle for the incremental one (Followers)."""
    from collections import Counter
    from operator import itemgetter

    learned: dict[int, dict[tuple[str, ...], Counter[str]]] = {k: {} for k in (1, 2, 3)}
    tally: dict[str, Counter[str]] = {}
    for seq in seqs:
        for i, agent in enumerate(seq):
            for who in (agent, "all"):
                tally.setdefault(who, Counter())["positions"] += i + 1 < len(seq)
            for k in (1, 2, 3):
                if i + k >= len(seq):
                    continue
                guess = None
                for h in range(min(history, i + 1), 0, -1):
                    seen = learned[k].get(tuple(seq[i + 1 - h : i + 1]))
                    if seen:
                        guess = max(seen.items(), key=itemgetter(1))[0]
                        break
                if guess is not None:
                    for who in (agent, "all"):
                        tally[who][f"p{k}"] += 1
                        tally[who][f"h{k}"] += guess == seq[i + k]
        for k in (1, 2, 3):
            for i in range(len(seq) - k):
                for h in range(1, min(history, i + 1) + 1):
                    ctx = tuple(seq[i + 1 - h : i + 1])
                    learned[k].setdefault(ctx, Counter())[seq[i + k]] += 1
    return {
        who: (t["positions"], *((t[f"p{k}"], t[f"h{k}"] / t[f"p{k}"] if t[f"p{k}"] else None)
                                for k in (1, 2, 3)))
        for who, t in tally.items()
    }  # fmt: skip


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("history", [1, 2])
def test_the_predictor_equals_its_first_form_on_random_workflows(seed: int, history: int) -> None:
    """Random sequences over few agents (ties in the counts are common)."""
    import random

    rng = random.Random(seed)
    seqs = [[rng.choice("abcd") for _ in range(rng.randint(1, 9))] for _ in range(60)]
    rows = []
    for n, seq in enumerate(seqs):
        prev, turns = None, {}
        for i, agent in enumerate(seq):
            turns[agent] = turns.get(agent, 0) + 1
            rows.append(
                call(f"w{n:03d}", agent, turns[agent], 100 * n + 2 * i, 100 * n + 2 * i + 1, prev)
            )
            prev = agent
    got = predictability(rows, history=history).accuracy
    want = _reference_accuracy(seqs, history)
    assert {a.agent_id for a in got} == set(want)
    for a in got:
        p, (p1, a1), (p2, a2), (p3, a3) = want[a.agent_id][0], *want[a.agent_id][1:]
        assert (a.positions, a.predicted_1, a.predicted_2, a.predicted_3) == (p, p1, p2, p3)
        assert (a.accuracy_1, a.accuracy_2, a.accuracy_3) == (a1, a2, a3), a.agent_id
