"""thread_turn at finalize (finalize/thread_turns.py), on hand-made rows with known answers."""

from kvscope.finalize.thread_turns import with_thread_turns


def row(uuid: str, thread: str | None, workflow: str | None, start: int | None) -> dict:
    return {"request_uuid": uuid, "thread_id": thread, "workflow_run_id": workflow,
            "start_ns": start, "thread_turn": 99}  # fmt: skip


def test_a_thread_s_invocations_in_order_of_their_first_call() -> None:
    rows = [
        row("a1", "t", "w2", 50),  # w2 started first (its first call at 10, from another process)
        row("a2", "t", "w1", 30),
        row("a3", "t", "w2", 10),
        row("b1", "u", "w3", 40),  # another thread: its own count
        row("c1", "t", "w4", 70),
        row("d1", None, "w5", 5),  # no thread: no turn
        row("e1", "t", None, 1),  # outside any invocation: no turn
    ]
    got = {r["request_uuid"]: r["thread_turn"] for r in with_thread_turns(rows)}
    assert got == {"a1": 1, "a3": 1, "a2": 2, "c1": 3, "b1": 1, "d1": None, "e1": None}


def test_ties_and_missing_start_times() -> None:
    rows = [row("x", "t", "wb", 5), row("y", "t", "wa", 5), row("z", "t", "wc", None)]
    got = [r["thread_turn"] for r in with_thread_turns(rows)]
    assert got == [2, 1, 3]  # a tie by workflow_run_id; no start time: last
