"""What a replay process loads: a JSONL trace replayed by the compiled kernel loads neither
pyarrow (records/formats.py tells Arrow apart by its first bytes) nor scipy.linalg (numba's BLAS
probe is deferred: sim/caches/compiled.py), and np.dot in compiled code still finds BLAS."""

import json
import subprocess
import sys
from pathlib import Path

CHILD = """
import sys
from pathlib import Path
from kvscope.sim import streamed
from kvscope.sim.inputs.sources import trace_reads
reads = trace_reads(Path(sys.argv[1]), 4)
result, _ = streamed.stream_lru(reads.chunks, 4, 8, attribute=False)
loaded = {m: m in sys.modules for m in ("pyarrow", "scipy.linalg", "numba.np.arraymath")}
import numba
import numpy as np
dot = numba.njit(lambda a, b: np.dot(a, b))(np.ones(3), np.ones(3))
print(int(result.cached_blocks.sum()), *loaded.values(), dot)
"""


def _child_on_a_small_trace(tmp_path: Path, child: str) -> list[str]:
    """What `child` prints, run on a 5-request Mooncake trace (block size 4)."""
    rows = [{"timestamp": i, "input_length": 16, "output_length": 1, "hash_ids": [1, 2, 3, i]}
            for i in range(5)]  # fmt: skip
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run([sys.executable, "-c", child, str(path)], capture_output=True,
                         text=True, check=True)  # fmt: skip
    return out.stdout.split()


def test_a_jsonl_replay_loads_neither_pyarrow_nor_scipy_linalg(tmp_path: Path) -> None:
    cached, pyarrow, linalg, compiled, dot = _child_on_a_small_trace(tmp_path, CHILD)
    assert int(cached) > 0  # the kernel ran: requests 2-5 find blocks 1-3
    assert (pyarrow, linalg, compiled) == ("False", "False", "True")
    assert float(dot) == 3.0


ARROW_CHILD = """
import sys
from pathlib import Path
from kvscope.sim import streamed
from kvscope.sim.inputs.sources import trace_reads
reads = trace_reads(Path(sys.argv[1]), 4)
result, _ = streamed.stream_lru(reads.chunks, 4, 8, attribute=False)
print(int(result.cached_blocks.sum()), "pandas" in sys.modules)
"""


def test_an_arrow_replay_does_not_load_pandas(tmp_path: Path) -> None:
    """pyarrow's own numpy conversions import pandas where it is installed (it is here, for
    MLflow): an Arrow token trace, nulls and all, is read without them (records/arrays.py)."""
    import pyarrow as pa

    table = pa.table({
        "request_id": [f"r{i}" for i in range(5)],
        "timestamp": pa.array([0.0, None, 2.0, 3.0, None]),
        "output_length": pa.array([1, 2, None, 4, 5], pa.int32()),
        "token_ids": pa.array([[*range(1, 9), i] for i in range(5)], pa.list_(pa.uint32())),
    })  # fmt: skip
    path = tmp_path / "t.arrow"
    with pa.ipc.new_stream(path, table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
    out = subprocess.run([sys.executable, "-c", ARROW_CHILD, str(path)], capture_output=True,
                         text=True, check=True)  # fmt: skip
    cached, pandas = out.stdout.split()
    assert int(cached) > 0  # requests 2-5 find the first two blocks
    assert pandas == "False"


READ_CHILD = """
import sys
from pathlib import Path
from kvscope.sim.inputs.sources import trace_reads
reads = trace_reads(Path(sys.argv[1]), 4)
print(sum(len(keys) for _, keys, _ in reads.chunks), "numba" in sys.modules)
"""


def test_a_small_jsonl_trace_is_read_without_loading_numba(tmp_path: Path) -> None:
    """numba's ~0.5 s of loading is paid for a large file's lists only (sim/inputs/chunks.py)."""
    keys, numba = _child_on_a_small_trace(tmp_path, READ_CHILD)
    assert int(keys) == 20 and numba == "False"
