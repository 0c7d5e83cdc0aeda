"""What a stream or trace file is, from its first bytes, without loading a reader for it:
standard library only, so that a process replaying a JSONL trace never imports pyarrow (~0.1 s
of CPU and ~28 MB it does not need). Arrow IPC files begin with MAGIC_FILE; an IPC stream (as
kvscope writes its streams) with its first message's continuation marker, Parquet with its
own. A compressed file (gzip, bzip2, xz: how public traces are often shipped) is told by its own
magic and read through the standard library's decompressor (`open_bytes`); zstd, which Python
3.11's library cannot read, is refused by name.
"""

import bz2
import gzip
import lzma
import zlib
from pathlib import Path
from typing import BinaryIO

COMPRESSED = {b"\x1f\x8b": gzip.open, b"BZh": bz2.open, b"\xfd7zXZ\x00": lzma.open}
ZSTD = b"\x28\xb5\x2f\xfd"
READ_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError)  # a torn or corrupt compressed file

MAGIC_FILE = b"ARROW1"
MAGIC_PARQUET = b"PAR1"
MAGIC_STREAM = b"\xff\xff\xff\xff"  # an IPC stream's first message's continuation marker


def head(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(8)


def is_arrow_stream(path: Path) -> bool:
    """An Arrow IPC stream (else, for a run's streams, an older run's JSONL)."""
    return head(path).startswith(MAGIC_STREAM)


def is_arrow(path: Path) -> bool:
    """An Arrow IPC file or stream, or a Parquet file: columns pyarrow reads
    (sim/inputs/arrow_tokens.py reads them as a token-id trace)."""
    first = head(path)
    return any(first.startswith(m) for m in (MAGIC_FILE, MAGIC_STREAM, MAGIC_PARQUET))


def compressed(path: Path) -> bool:
    """gzip, bzip2, xz or zstd, by the first bytes."""
    first = head(path)
    return first.startswith(ZSTD) or any(first.startswith(m) for m in COMPRESSED)


def open_bytes(path: Path) -> BinaryIO:
    """`path` opened for reading bytes, decompressed where it is gzip, bzip2 or xz; a
    ValueError for zstd (decompress it first: `zstd -d`)."""
    first = head(path)
    if first.startswith(ZSTD):
        raise ValueError("is zstd-compressed, which this Python cannot read: decompress it first")
    for magic, opener in COMPRESSED.items():
        if first.startswith(magic):
            return opener(path, "rb")  # type: ignore[return-value]
    return path.open("rb")
