"""What a trace file is, from its first bytes, without loading a reader for it: an Arrow token-id
trace (IPC file or stream) is told apart here so that a process replaying JSONL never imports
pyarrow (~0.1 s of CPU and ~28 MB of memory it does not need).
"""

from pathlib import Path

MAGIC_FILE = b"ARROW1"
MAGIC_STREAM = b"\xff\xff\xff\xff"  # an IPC stream's first message's continuation marker


def head(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(8)


def is_arrow(path: Path) -> bool:
    """An Arrow IPC file or stream (sim/inputs/arrow_tokens.py reads it)."""
    first = head(path)
    return first.startswith(MAGIC_FILE) or first.startswith(MAGIC_STREAM)
