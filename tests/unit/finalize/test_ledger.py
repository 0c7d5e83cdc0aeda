"""finalize.ledger: block lives as columns, on test_provenance's hand-made events (known answers).

Block size 4. A stores S (2 blocks) + a; a is evicted in the step that stores B's block b; C
stores a again (a new life of the same key); D's blocks come without a session; a reset clears
every life still cached.
"""

import numpy as np
from test_provenance import EVENTS, S, a, b, batch, stored, z

from kvscope.finalize.blocktable import CLEARED, EVICTED, STILL_CACHED
from kvscope.finalize.ledger import KEYED, ORPHAN, UNMATCHABLE, build_ledger
from kvscope.records import blockkey
from kvscope.records.kv_events import KvBatch, KvEvent


def test_columns_in_ledger_order() -> None:
    ledger = build_ledger(EVENTS)
    assert len(ledger) == 8 and ledger.block_size == 4 and ledger.orphan_blocks == 0
    assert ledger.block_hash.tolist() == [1, 2, 3, 4, 5, 10, 11, 12]
    assert ledger.tokens.tolist() == [4] * 8
    assert ledger.stored_ns.tolist() == [10, 10, 10, 20, 35, 55, 55, 55]
    assert ledger.seq.tolist() == [0, 0, 0, 1, 2, 3, 3, 3]
    assert ledger.session_id == ["A", "A", "A", "B", "C", None, None, None]
    # a is evicted at 20 by the step that stored B's block; the reset at 70 clears the others
    assert ledger.removal.tolist() == [CLEARED, CLEARED, EVICTED] + [CLEARED] * 5
    assert ledger.removed_ns.tolist() == [70, 70, 20] + [70] * 5
    assert ledger.evictor == [None, None, "B"] + [None] * 5


def test_keys_are_the_prompts_prefix_keys() -> None:
    ledger = build_ledger(EVENTS)
    assert (ledger.key_state == KEYED).all()
    keys, _, _ = blockkey.prompt_blocks([np.array(S + a), np.array(S + b), np.array(z + S)], 4)
    assert ledger.key[:3].tolist() == keys[:3].tolist()  # S, S, a
    assert ledger.key[3] == keys[5]  # b behind S
    assert ledger.key[4] == ledger.key[2]  # C's a: a new life of the same key
    assert ledger.key[5:].tolist() == keys[6:].tolist()  # z, then S behind z: other keys


def test_still_cached_orphan_and_unmatchable_lives() -> None:
    ledger = build_ledger([
        (batch(0, 1), stored([1, 2], None, S[:7], "A")),  # the second block is 3 tokens
        (batch(1, 2), KvEvent("stored", (3,), 2, (9, 9, 9, 9), 4, "GPU", "A")),  # behind it
        (batch(2, 3), stored([7], 999, a, "B")),  # its parent was never seen
    ])  # fmt: skip
    assert ledger.key_state.tolist() == [KEYED, UNMATCHABLE, UNMATCHABLE, ORPHAN]
    assert ledger.removal.tolist() == [STILL_CACHED] * 4 and ledger.orphan_blocks == 1
    assert ledger.tokens.tolist() == [4, 3, 4, 4]
    lives = ledger.lives
    assert [x.key for x in lives[1:]] == [-1, -1, None] and lives[0].key == ledger.key[0]
    assert all(x.removed_ns is None and x.removal is None for x in lives)


def test_lives_view() -> None:
    lives = build_ledger(EVENTS).lives
    evicted = lives[2]
    assert (evicted.block_hash, evicted.stored_ns, evicted.removed_ns) == (3, 10, 20)
    assert (evicted.removal, evicted.evictor, evicted.evictor_method) == (
        "evicted", "B", "same-step store",
    )  # fmt: skip
    assert (lives[0].removal, lives[0].removed_ns, lives[0].evictor) == ("cleared", 70, None)
    assert [x.session_id for x in lives] == ["A", "A", "A", "B", "C", None, None, None]


def test_no_sized_block_gives_an_empty_ledger() -> None:
    ledger = build_ledger([(KvBatch(seq=0, ts_ns=1), KvEvent("removed", (5,)))])
    assert len(ledger) == 0 and ledger.block_size is None and ledger.lives == []
