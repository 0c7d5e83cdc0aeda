"""The state of a physical block in vLLM's block pool (pool.py, pool_compiled.py)."""

BLANK = 0  # no hash: free blocks in this state are reused before any cached block is evicted
KEYED = 1  # holds a prompt key: a full block of prompt tokens and its prefix
OPAQUE = 2  # a hashed output block: its content is unknown to a trace, no lookup matches it
