"""KVFlow-style microbenchmark prompts: token lengths set exactly, content random but seeded.

Each agent gets a fixed prompt of `fixed_tokens` tokens (the system message, identical on every
call) and each call a fresh dynamic suffix of `dynamic_tokens` tokens (the user message), as in
KVFlow's evaluation (Section 4), where prompts are random token sequences of controlled length.

Exactness: the text is built from vocabulary words that are one token both with and without a
leading space, joined by single spaces. Under a byte-level BPE with a word-splitting
pre-tokenizer (SmolLM2, Llama-3, Qwen2) such text encodes to exactly one token per word, and the
result is re-encoded and adjusted anyway. Inside a chat template the content sits between a
newline and a special token, so the counts hold there too; a tokenizer that merges across those
boundaries can be off by a token or two per message. The chat template's own tokens
(`<|im_start|>system\\n` ...) come on top of these counts.
"""

import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

from kvscope.config import SyntheticConfig
from kvscope.workload.prompts import PromptInfo

if TYPE_CHECKING:
    from tokenizers import Tokenizer

SYNTHETIC_TEMPLATE_VERSION = "kvflow-synthetic-v1"
SYNTHETIC_LAYOUT = "synthetic"

_WORD_TOKEN = re.compile(r"^Ġ[a-z]{3,10}$")  # Ġ: the byte-level BPE's leading-space marker
_MIN_POOL = 256


@dataclass(frozen=True)
class SyntheticPrompts:
    """Deterministic prompts for a given tokenizer, lengths and seed.

    `share_fixed=True` (the default) gives an agent the same fixed prompt in every workflow, like
    an application's agent; False gives each workflow its own, like KVFlow's "non-sharing"
    concurrent workflows (Section 4.2).
    """

    tokenizer: "Tokenizer"
    lengths: SyntheticConfig
    seed: int = 0
    share_fixed: bool = True

    @property
    def prompt_info(self) -> PromptInfo:
        return PromptInfo(template_version=SYNTHETIC_TEMPLATE_VERSION, layout=SYNTHETIC_LAYOUT)

    def fixed_prompt(self, agent: str, workflow_index: int = 0) -> str:
        scope = "shared" if self.share_fixed else f"w{workflow_index}"
        return self._text(f"fixed:{scope}:{agent}", self.lengths.fixed_tokens)

    def dynamic_suffix(self, agent: str, workflow_index: int, turn_id: int) -> str:
        return self._text(
            f"dynamic:w{workflow_index}:t{turn_id}:{agent}", self.lengths.dynamic_tokens
        )

    def messages(self, agent: str, workflow_index: int, turn_id: int) -> list[dict[str, str]]:
        return [
            {"role": "system", "content": self.fixed_prompt(agent, workflow_index)},
            {"role": "user", "content": self.dynamic_suffix(agent, workflow_index, turn_id)},
        ]

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    @cached_property
    def _pools(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """(words that are one token after a space, those that are also one token alone)."""
        candidates = sorted(tok[1:] for tok in self.tokenizer.get_vocab() if _WORD_TOKEN.match(tok))
        spaced = self.tokenizer.encode_batch(
            [" " + w for w in candidates], add_special_tokens=False
        )
        bare = self.tokenizer.encode_batch(candidates, add_special_tokens=False)
        inner = tuple(w for w, e in zip(candidates, spaced, strict=True) if len(e.ids) == 1)
        ok_inner = set(inner)
        first = tuple(
            w for w, e in zip(candidates, bare, strict=True) if len(e.ids) == 1 and w in ok_inner
        )
        if len(first) < _MIN_POOL:
            raise ValueError(
                "tokenizer has too few single-token words for synthetic prompts "
                f"({len(first)} < {_MIN_POOL}); is it a byte-level BPE?"
            )
        return first, inner

    def _text(self, key: str, n_tokens: int) -> str:
        first, inner = self._pools
        # str seeds hash deterministically (unlike hash()), so runs repeat across processes.
        rng = random.Random(f"{self.seed}:{key}")
        words = [rng.choice(first)] + [rng.choice(inner) for _ in range(n_tokens - 1)]
        return _fit(words, n_tokens, inner, rng, self.count)


def _fit(
    words: list[str],
    target: int,
    pool: Sequence[str],
    rng: random.Random,
    count: Callable[[str], int],
) -> str:
    """Drop or add words until the re-encoded text has `target` tokens (or the closest seen)."""
    best = " ".join(words)
    best_gap = abs(count(best) - target)
    for _ in range(2 * target + 8):
        text = " ".join(words)
        n = count(text)
        if abs(n - target) < best_gap:
            best, best_gap = text, abs(n - target)
        if n == target:
            return text
        if n > target and len(words) > 1:
            words.pop()
        else:
            words.append(rng.choice(pool))
    return best
