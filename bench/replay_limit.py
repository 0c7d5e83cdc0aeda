"""Issue 31's limit: a 100k-request PEER-like trace, LRU at one capacity, end to end.

    PYTHONPATH=src python bench/replay.py --limit [--requests 100000] [--repeat 2]

The trace is bench/replay.py's `peer_trace`, written twice: as a Mooncake trace (`hash_ids`: its
block keys; `end_timestamp`: its lifetimes, so requests overlap as in a run) and as a token-id
trace (each full block's 16 tokens derived from its chained key, so equal prefixes stay equal,
plus the prompt's partial block). Each is replayed by `kvscope replay --policy lru` at one
capacity (prompt-only, the default for a trace) and by kvlint 0.1.1's vLLM block simulator,
driven one line at a time as its streamed simulator is (from hash_ids: its `block_hashes`
replaced by the ids as given; it never sees lifetimes: one request after another), each in a
child under /usr/bin/time: user + sys CPU seconds and peak RSS, `--repeat` times.
The token-id trace is also written as Arrow (an IPC stream of list<uint32> token ids, the form of
kvscope's own prompt_tokens.arrow): kvscope replays it with no text to parse (kvlint reads
JSONL only). Then the LRU sweep: the Mooncake trace without `end_timestamp` (requests one after
another) at the capacity and at 10 (a tenth of it to all of it).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa

KVLINT_STREAM = """
import json, sys
import kvlint.sim.vllm_blocks as vb
path, bs, cap, kind = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if kind == "hash_ids":
    vb.block_hashes = lambda ids, _bs: ids  # the ids are the block digests
sim, cached = vb.VLLMBlockSimulator(bs, cap), 0
with open(path) as f:
    for n, line in enumerate(f):
        row = json.loads(line)
        if kind == "hash_ids":
            ids = row["hash_ids"][: row["input_length"] // bs]
            cached += sim.feed_tokens(str(n), ids).cached_tokens
        else:
            cached += sim.feed_tokens(row["request_id"], row["token_ids"]).cached_tokens
print(cached)
"""


def write_traces(d: Path, n: int, block_size: int) -> dict[str, Path]:
    """The PEER-like trace as Mooncake (with and without end_timestamp) and as token ids (JSONL
    and Arrow)."""
    from replay import peer_trace

    tr = peer_trace(n, block_size)
    paths = {k: d / f"{k}.jsonl" for k in ("mooncake", "sequential", "tokens")}
    paths["arrow"] = d / "tokens.arrow"
    arrow = ArrowRows(paths["arrow"])
    shifts = np.arange(block_size, dtype=np.uint64) * np.uint64(64 // block_size or 1)
    with (
        paths["mooncake"].open("wb") as moon,
        paths["sequential"].open("wb") as seq,
        paths["tokens"].open("wb") as tok,
    ):
        for i in range(n):
            keys = tr.keys[tr.offsets[i] : tr.offsets[i + 1]]
            row = {"timestamp": float(tr.start_s[i] * 1e3),
                   "input_length": int(tr.prompt_tokens[i]),
                   "output_length": int(tr.output_tokens[i]), "hash_ids": keys}  # fmt: skip
            seq.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
            row["end_timestamp"] = float(tr.end_s[i] * 1e3)
            moon.write(orjson.dumps(row, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
            blocks = ((keys[:, None] >> shifts[None, :]) & np.uint64(0x7FFF)).ravel()
            extra = int(tr.prompt_tokens[i]) - len(blocks)
            ids = np.concatenate([blocks.astype(np.int64), np.full(extra, 7, dtype=np.int64)])
            trow = {"request_id": f"r{i}", "timestamp": row["timestamp"],
                    "end_timestamp": row["end_timestamp"], "token_ids": ids,
                    "output_length": int(tr.output_tokens[i])}  # fmt: skip
            tok.write(orjson.dumps(trow, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n")
            arrow.add(trow)
    arrow.close()
    return paths


class ArrowRows:
    """Token-id rows written as an Arrow IPC stream, a batch of 2,000 rows at a time."""

    SCHEMA = pa.schema([("request_id", pa.string()), ("timestamp", pa.float64()),
                        ("end_timestamp", pa.float64()), ("output_length", pa.int64()),
                        ("token_ids", pa.list_(pa.uint32()))])  # fmt: skip

    def __init__(self, path: Path) -> None:
        self.sink = pa.OSFile(str(path), "wb")
        self.writer = pa.ipc.new_stream(self.sink, self.SCHEMA)
        self.rows: list[dict] = []

    def add(self, row: dict) -> None:
        self.rows.append(row)
        if len(self.rows) == 2000:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        ids = [r["token_ids"] for r in self.rows]
        offsets = np.zeros(len(ids) + 1, dtype=np.int32)
        np.cumsum([len(x) for x in ids], out=offsets[1:])
        values = pa.array(np.concatenate(ids).astype(np.uint32))
        columns = [pa.array([r[k] for r in self.rows]) for k in self.SCHEMA.names[:4]]
        columns.append(pa.ListArray.from_arrays(pa.array(offsets), values))
        self.writer.write_batch(pa.record_batch(columns, schema=self.SCHEMA))
        self.rows = []

    def close(self) -> None:
        self.flush()
        self.writer.close()
        self.sink.close()


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(user + sys CPU s, peak RSS MB, stdout) of `cmd` under /usr/bin/time."""
    out = subprocess.run(
        ["/usr/bin/time", "-f", "TIME %U %S %M", *cmd],
        capture_output=True, text=True, check=True, env=env,
    )  # fmt: skip
    line = [x for x in out.stderr.splitlines() if x.startswith("TIME ")][-1].split()
    return float(line[1]) + float(line[2]), int(line[3]) / 1024, out.stdout


def kvscope_cmd(path: Path, bs: int, caps: list[int], out: Path) -> list[str]:
    kvscope = str(Path(sys.executable).parent / "kvscope")
    caps_arg = ",".join(map(str, caps))
    return [kvscope, "replay", str(path), "--block-size", str(bs), "--policy", "lru",
            "--capacity-tokens", caps_arg, "--jobs", "1", "--json", str(out)]  # fmt: skip


def limit(n: int, block_size: int, capacity: int, repeat: int) -> None:
    from replay import _bare_env, anchors_python

    anchors = anchors_python()
    with open("/proc/loadavg") as f:
        print(f"load average before: {f.read().split()[:3]}")
    with tempfile.TemporaryDirectory() as d:
        paths = write_traces(Path(d), n, block_size)
        sizes = {k: p.stat().st_size / 2**20 for k, p in paths.items()}
        print(f"{n} requests, block size {block_size}, LRU at {capacity} tokens; "
              f"JSONL: Mooncake {sizes['mooncake']:.0f} MB, "
              f"tokens {sizes['tokens']:.0f} MB")  # fmt: skip
        out = Path(d) / "out.json"
        for kind, path in (("hash_ids", paths["mooncake"]), ("token_ids", paths["tokens"])):
            for _ in range(repeat):
                k_cpu, k_mb, _ = timed(kvscope_cmd(path, block_size, [capacity], out))
                k_cached = _results(out)[0]["cached_tokens"]
                script = [anchors, "-c", KVLINT_STREAM, str(path), str(block_size)]
                a_cpu, a_mb, a_out = timed(
                    [*script, str(capacity // block_size), kind], env=_bare_env()
                )
                print(f"  from {kind:9s}: kvscope {k_cpu:6.2f} s CPU {k_mb:5.0f} MB "
                      f"(cached {k_cached}) | kvlint {a_cpu:6.2f} s CPU {a_mb:5.0f} MB "
                      f"(cached {int(a_out.strip())}) | kvlint / kvscope CPU "
                      f"{a_cpu / k_cpu:.2f}x, RSS {k_mb / a_mb:.1f}x kvlint's")  # fmt: skip
        for _ in range(repeat):
            k_cpu, k_mb, _ = timed(kvscope_cmd(paths["arrow"], block_size, [capacity], out))
            print(f"  from token_ids as Arrow ({sizes['arrow']:.0f} MB): kvscope {k_cpu:6.2f} s "
                  f"CPU {k_mb:5.0f} MB (cached {_results(out)[0]['cached_tokens']})")  # fmt: skip
        caps = [capacity * k // 10 for k in range(1, 11)]  # a tenth of it to all of it
        for _ in range(repeat):
            one, one_mb, _ = timed(kvscope_cmd(paths["sequential"], block_size, caps[-1:], out))
            ten, ten_mb, _ = timed(kvscope_cmd(paths["sequential"], block_size, caps, out))
            print(f"  LRU sweep, requests one after another: 1 capacity {one:.2f} s CPU "
                  f"{one_mb:.0f} MB, 10 capacities {ten:.2f} s CPU {ten_mb:.0f} MB: "
                  f"{ten / one:.2f}x")  # fmt: skip
    with open("/proc/loadavg") as f:
        print(f"load average after: {f.read().split()[:3]}")


def _results(path: Path) -> list[dict]:
    """The summaries `kvscope replay --json` wrote (a list of them)."""
    doc = orjson.loads(path.read_bytes())
    return doc if isinstance(doc, list) else doc.get("results", [doc])


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--capacity-tokens", type=int, default=20480)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args(argv)
    limit(a.requests, a.block_size, a.capacity_tokens, a.repeat)
