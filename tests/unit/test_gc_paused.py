"""gc_paused: the collector off inside, as it was after (an exception included), and the
streamed replay leaves the app's (a library caller's) collector as it found it."""

import gc
import json
from pathlib import Path

import pytest

from kvscope.gc_paused import gc_paused
from kvscope.replaying import streamed_document


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_off_inside_and_as_it_was_after(enabled: bool) -> None:
    (gc.enable if enabled else gc.disable)()
    try:
        with gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(RuntimeError), gc_paused():
            raise RuntimeError("the work failed")
        assert gc.isenabled() is enabled
    finally:
        gc.enable()


def test_the_streamed_replay_runs_paused_and_restores_the_collector(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = tmp_path / "t.jsonl"
    lines = [{"timestamp": i, "input_length": 32, "output_length": 4, "hash_ids": [i % 3, i]}
             for i in range(50)]  # fmt: skip
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    seen: list[bool] = []
    import kvscope.replaying as replaying

    real = replaying._streamed
    monkeypatch.setattr(replaying, "_streamed", lambda *a: seen.append(gc.isenabled()) or real(*a))
    doc = streamed_document(trace, 16, [256])
    assert doc is not None and doc["results"][0]["cached_tokens"] > 0
    assert seen == [False] and gc.isenabled()
