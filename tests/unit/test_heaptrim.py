"""finalize.heaptrim: freed C heap memory goes back to the system, and nothing breaks without it."""

import ctypes
import ctypes.util
import sys

import pytest

from kvscope.finalize import heaptrim

MIB = 1 << 20


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / MIB


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or heaptrim._TRIM is None, reason="glibc only"
)
def test_freed_heap_pages_are_returned() -> None:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    big = libc.malloc(16 * MIB)
    libc.free(big)  # freeing a mapped chunk raises the mmap threshold: 1 MiB is from the heap
    chunks = [libc.malloc(MIB) for _ in range(24)]
    for c in chunks:
        ctypes.memset(c, 1, MIB)  # resident
    pin = libc.malloc(64)  # above them: the heap's top cannot shrink past it
    for c in chunks:
        libc.free(c)
    kept = rss_mib()  # glibc keeps the 24 MiB below `pin` resident
    heaptrim.release()
    assert kept - rss_mib() >= 12
    libc.free(pin)


def test_release_is_a_no_op_without_malloc_trim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heaptrim, "_TRIM", None)
    assert heaptrim.release() is None  # nothing to call, nothing raised
