"""Finalize: a run directory's streams -> its tables (requests with their Level 2 context and
Level 3 provenance, KV events, block lives), the same at the end of a run and in `kvscope convert`.

tables.py reads and writes the run directory; divergence.py (where prompts first diverge) and
provenance.py (the block ledger: who stored, reused and evicted each block) fill the columns.
The prompts' token ids are held as prompts.py's distinct pieces, hashed by records.blockkey (on
every token) and piecehash.py (on the distinct pieces).
"""

from kvscope.finalize.tables import convert, finalize

__all__ = ["convert", "finalize"]
