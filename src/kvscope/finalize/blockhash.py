"""Temporary: a re-export of records.blockkey (block keys and hashes are defined there).

kvcolumns, prompts and ledger import this until they are moved to kvscope.records.blockkey;
then this module is deleted. Nothing else should import it.
"""

from kvscope.records.blockkey import (
    BATCH_TOKENS,
    MASK,
    Batches,
    Tokens,
    as_batches,
    batches,
    chain,
    first_windows_of_sorted,
    multiplier,
    powers,
    prompt_blocks,
    row_sums,
    span_hashes,
    unchain,
    within,
)

__all__ = [
    "BATCH_TOKENS",
    "MASK",
    "Batches",
    "Tokens",
    "as_batches",
    "batches",
    "chain",
    "first_windows_of_sorted",
    "multiplier",
    "powers",
    "prompt_blocks",
    "row_sums",
    "span_hashes",
    "unchain",
    "within",
]
