"""`gc_paused()`: Python's cyclic garbage collector paused over bulk work (restored after, as it
was), for work that makes many objects in no reference cycle (rows, plans, spans, a trace's
parsed lines), each of which every collection would walk again, and the whole heap of imported
modules with them at each full collection. Nothing is left uncollected: refcounting frees what
the work drops, and a collection after it finds any cycle. Measured: a third of the bulk trace
write's time at 5,000 traces (traces.py); ~0.2-0.3 s of `kvscope replay`'s ~2.7-3.3 s on the
100k-request Mooncake trace (replaying.streamed_document).
"""

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off inside, back to what it was after."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
