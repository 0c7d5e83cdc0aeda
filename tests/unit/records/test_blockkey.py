"""records.blockkey: block keys chain like the engines', windows are found at any offset."""

import numpy as np
from oracles import first_windows

from kvscope.records import blockkey

rng = np.random.default_rng(7)
A = rng.integers(0, 50_000, size=40)


def test_keys_chain_on_the_parent_and_hold_the_whole_prefix() -> None:
    other = np.concatenate([A[:8], [1, 2, 3, 4], A[12:]])  # differs in block 2 (size 4)
    keys, hashes, offsets = blockkey.prompt_blocks([A, other, A[:10], []], 4)
    assert offsets.tolist() == [0, 10, 20, 22, 22]
    key = 0
    for i in range(10):
        key = blockkey.chain(key, int(hashes[i]), 4)
        assert key == keys[i]
    assert (keys[10:12] == keys[:2]).all() and (keys[12:20] != keys[2:10]).all()
    assert (hashes[13:20] == hashes[3:10]).all()  # the same blocks, behind another prefix
    assert (keys[20:22] == keys[:2]).all()  # a prompt's partial last block has no key


def test_token_ids_as_lists_tuples_and_arrays_hash_alike() -> None:
    as_list = blockkey.prompt_blocks([A.tolist()], 8)
    for same in ([tuple(A.tolist())], [A.astype(np.int32)]):
        for x, y in zip(blockkey.prompt_blocks(same, 8), as_list, strict=True):
            assert (x == y).all()


def test_batches_cover_every_prompt_once() -> None:
    prompts = [[0] * n for n in (5, 0, 9, 3, 20, 1)]
    spans = list(blockkey.batches(np.array([len(p) for p in prompts]), budget=10))
    assert [list(s) for s in spans] == [[0, 1], [2], [3], [4], [5]]
    assert np.array_equal(
        blockkey.prompt_blocks(prompts, 2)[0],
        np.concatenate([blockkey.prompt_blocks([p], 2)[0] for p in prompts]),
    )


def test_windows_are_found_at_any_offset_in_the_first_prompt_holding_them() -> None:
    size = 4
    block = A[10:14]
    prompts = [A[:7], A[3:20], A[:30], A[30:]]  # block at offsets -, 7, 10, -
    _, hashes, _ = blockkey.prompt_blocks([block, A[30:34], [9, 9, 9, 9]], size)
    first = first_windows(prompts, size, hashes)
    assert first.tolist() == [1, 3, 4]  # found in prompt 1; A[30:34] only in 3; never: len
    # a window across the end of one prompt and the start of the next is no window
    across = blockkey.prompt_blocks([np.concatenate([A[5:7], A[30:32]])], size)[1]
    assert first_windows(prompts, size, across).tolist() == [4]
    assert first_windows(prompts, size, np.zeros(0, np.uint64)).tolist() == []
