"""records/priorities.py's next-agent predictor, scored on the calls (the hints' accuracy)."""

from kvscope.records.priorities import next_agent_accuracy

PEER = ("planner", "executor", "expresser", "reviewer")


def cycle(times: int) -> list[tuple[str, str | None]]:
    agents = list(PEER) * times
    return [(a, agents[i - 1] if i else None) for i, a in enumerate(agents)]


def test_a_fixed_cycle_is_predicted_once_each_edge_was_seen() -> None:
    # cycle 1 predicts nothing; cycle 2 all but the planner (reviewer -> planner not seen yet)
    assert next_agent_accuracy(cycle(1)) is None
    assert next_agent_accuracy(cycle(3)) == 1.0


def test_model_made_routing_counts_the_misses() -> None:
    calls = [
        ("supervisor", None),
        ("researcher", "supervisor"),
        ("supervisor", "researcher"),
        ("writer", "supervisor"),
        ("supervisor", "writer"),
        ("researcher", "supervisor"),
    ]
    # predicted: writer after supervisor (guess researcher: miss); researcher after supervisor
    # (researcher 1, writer 1: a tie, the first seen wins: hit)
    assert next_agent_accuracy(calls) == 0.5


def test_no_agent_is_an_agent_of_its_own() -> None:
    assert next_agent_accuracy([(None, None), (None, None), ("a", None)]) == 0.5
