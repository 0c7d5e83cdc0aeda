"""Hand-made and random traces for the simulator tests."""

from __future__ import annotations

import numpy as np

from kvscope.sim.trace import Trace


def make_trace(
    blocks: list[list[int]],
    *,
    start: list[float] | None = None,
    end: list[float] | None = None,
    block_size: int = 4,
    output: int = 1,
    agents: list[str | None] | None = None,
    workflows: list[str | None] | None = None,
    previous: list[str | None] | None = None,
) -> Trace:
    """One request per list of block keys; prompts are exactly those full blocks plus 1 token.

    Keys are used as given (a test writes its chains by hand). Without times, requests run one
    after another; `output=1` adds no block beyond the prompt's partial one.
    """
    n = len(blocks)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum([len(b) for b in blocks], out=offsets[1:])
    keys = np.array([k for b in blocks for k in b], dtype=np.uint64)
    st = np.array(start if start is not None else range(n), dtype=float)
    en = np.array(end if end is not None else st, dtype=float)
    none: list[str | None] = [None] * n
    return Trace(
        "test",
        block_size,
        tuple(str(i) for i in range(n)),
        st,
        en,
        np.array([len(b) * block_size + 1 for b in blocks], dtype=np.int64),
        np.full(n, output, dtype=np.int64),
        keys,
        offsets,
        tuple(agents or none),
        tuple(workflows or none),
        tuple(previous or none),
    )


def random_trace(seed: int, n: int = 60, block_size: int = 4) -> Trace:
    """Requests sharing prefixes in a small tree, with overlapping lifetimes and outputs."""
    rng = np.random.default_rng(seed)
    blocks, start, end, outs, agents, wfs, prev = [], [], [], [], [], [], []
    roots = rng.integers(1, 1 << 40, size=3)
    last: dict[int, str] = {}
    t = 0.0
    for _ in range(n):
        root = int(roots[rng.integers(0, 3)])
        depth = int(rng.integers(1, 9))
        chain, k = [], root
        for d in range(depth):
            branch = int(rng.integers(0, 2 if d < 4 else 6))
            k = (k * 1_000_003 + branch + 1) % (1 << 62)
            chain.append(k)
        blocks.append(chain)
        t += float(rng.exponential(1.0))
        start.append(t)
        end.append(t + float(rng.exponential(2.0)))
        outs.append(int(rng.integers(1, 3 * block_size)))
        w = int(rng.integers(0, 4))
        a = f"a{rng.integers(0, 4)}"
        wfs.append(f"w{w}")
        prev.append(last.get(w))
        agents.append(a)
        last[w] = a
    tr = make_trace(
        blocks,
        start=start,
        end=end,
        block_size=block_size,
        agents=agents,
        workflows=wfs,
        previous=prev,
    )
    extra = rng.integers(0, block_size, size=n)
    return Trace(
        **{
            **tr.__dict__,
            "prompt_tokens": tr.prompt_tokens - 1 + extra,
            "output_tokens": np.array(outs, dtype=np.int64),
        }
    )
