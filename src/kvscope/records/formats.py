"""What a stream or trace file is, from its first bytes, without loading a reader for it:
standard library only, so that a process replaying a JSONL trace never imports pyarrow (~0.1 s
of CPU and ~28 MB it does not need). Arrow IPC files begin with MAGIC_FILE; an IPC stream (as
kvscope writes its streams) with its first message's continuation marker.
"""

from pathlib import Path

MAGIC_FILE = b"ARROW1"
MAGIC_STREAM = b"\xff\xff\xff\xff"  # an IPC stream's first message's continuation marker


def head(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(8)


def is_arrow_stream(path: Path) -> bool:
    """An Arrow IPC stream (else, for a run's streams, an older run's JSONL)."""
    return head(path).startswith(MAGIC_STREAM)


def is_arrow(path: Path) -> bool:
    """An Arrow IPC file or stream (sim/inputs/arrow_tokens.py reads it as a token-id trace)."""
    first = head(path)
    return first.startswith(MAGIC_FILE) or first.startswith(MAGIC_STREAM)
