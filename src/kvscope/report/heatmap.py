"""Evictor x victim agent heatmap: how many blocks each agent's calls evicted from each agent,
and (in brackets) how many tokens later calls had to recompute because of it."""

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only; no display on servers and CI
import matplotlib.pyplot as plt

from kvscope.analysis.evictions import Cell, rank


def plot(cells: Sequence[Cell], path: Path, title: str) -> Path:
    """Rows: evictor agent; columns: victim (owner) agent; all workflows together."""
    evictors = sorted({c.evictor_agent_id for c in cells}, key=rank)
    victims = sorted({c.victim_agent_id for c in cells}, key=rank)
    counts = [[0] * len(victims) for _ in evictors]
    harm = [[0] * len(victims) for _ in evictors]
    for c in cells:
        i, j = evictors.index(c.evictor_agent_id), victims.index(c.victim_agent_id)
        counts[i][j] += c.evictions
        harm[i][j] += c.recomputed_tokens
    fig, ax = plt.subplots(
        figsize=(1.6 * max(len(victims), 2) + 2, 1.0 * max(len(evictors), 2) + 1.5)
    )
    im = ax.imshow(counts or [[0]], cmap="Reds", aspect="auto")
    ax.set_xticks(range(len(victims)), victims)
    ax.set_yticks(range(len(evictors)), evictors)
    ax.set_xlabel("victim: agent whose block was evicted")
    ax.set_ylabel("evictor (inferred)")
    top = max((v for row in counts for v in row), default=0)
    for i, row in enumerate(counts):
        for j, n in enumerate(row):
            label = f"{n}\n({harm[i][j]:,} tok)" if harm[i][j] else str(n)
            ax.text(j, i, label, ha="center", va="center",
                    color="white" if top and n > top / 2 else "black", fontsize=9)  # fmt: skip
    fig.colorbar(im, ax=ax, label="blocks evicted")
    ax.set_title(f"{title}\n(recomputed tokens in brackets)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
