"""BlockManager: block tables, ref counts, copy-on-write, prefix caching, swap."""

import pytest

from labsupport.engine.block_manager import BlockManager, NoFreeBlocksError, block_hash


def run_request(bm: BlockManager, seq_id, prompt, new_tokens):
    """What the engine does for one request: allocate the prompt, compute it, then feed each
    sampled token but the last (the last one is never fed back), then free."""
    bm.allocate(seq_id, prompt)
    bm.mark_computed(seq_id, len(prompt))
    for tok in new_tokens[:-1]:
        bm.append_slot(seq_id, tok)
        bm.mark_computed(seq_id, bm.num_slots(seq_id))
    bm.audit()
    bm.free(seq_id)


# ---------------------------------------------------------------------------- prefix hashes
def test_hash_chains_parent_and_all_token_ids():
    a = block_hash(None, [65, 1, 2, 3])
    b = block_hash(None, [321, 1, 2, 3])
    after_a = block_hash(a, [7, 8, 9, 10])
    after_b = block_hash(b, [7, 8, 9, 10])
    alone = block_hash(None, [7, 8, 9, 10])
    assert len({a, b, after_a, after_b, alone}) == 5
    assert block_hash(a, (7, 8, 9, 10)) == after_a              # a function of the values only


def test_same_block_after_different_parents_is_a_miss():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True)
    run_request(bm, "a", [65, 1, 2, 3, 7, 8, 9, 10, 11], [0])
    assert bm.num_evictable_blocks == 2
    assert bm.num_prefix_hit_tokens([321, 1, 2, 3, 7, 8, 9, 10, 11]) == 0
    assert bm.num_prefix_hit_tokens([65, 1, 2, 3, 7, 8, 9, 10, 99]) == 8
    assert bm.num_prefix_hit_tokens([65, 1, 2, 3, 7, 8, 9, 99, 99]) == 4


def test_hash_collision_is_confirmed_by_token_ids():
    bm = BlockManager(num_blocks=16, block_size=4, enable_prefix_caching=True, hash_fn=lambda p, t: 0)
    run_request(bm, "a", [65, 1, 2, 3, 9], [0])
    cached = [b.block_id for b in bm.blocks if b.hash is not None]
    assert len(cached) == 1
    # same hash (0), different ids: a miss, and fresh blocks
    assert bm.num_prefix_hit_tokens([321, 1, 2, 3, 9]) == 0
    assert bm.allocate("b", [321, 1, 2, 3, 9]) == 0
    assert cached[0] not in bm.block_table("b")
    # same ids: a confirmed hit on the stored block
    assert bm.allocate("c", [65, 1, 2, 3, 9]) == 4
    assert bm.block_table("c")[0] == cached[0]
    bm.audit()


def test_prefix_hit_never_covers_the_last_token():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    run_request(bm, "a", [1, 2, 3, 4, 5, 6, 7, 8], [0, 0])
    # an 8-token prompt (two full blocks): at most one block may be skipped
    assert bm.allocate("b", [1, 2, 3, 4, 5, 6, 7, 8]) == 4


def test_blocks_are_registered_only_once_computed():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    bm.allocate("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert bm.num_prefix_hit_tokens([1, 2, 3, 4, 5, 6, 7, 8, 9]) == 0   # not computed yet
    bm.mark_computed("a", 5)
    assert bm.num_prefix_hit_tokens([1, 2, 3, 4, 5, 6, 7, 8, 9]) == 4
    bm.mark_computed("a", 9)
    assert bm.num_prefix_hit_tokens([1, 2, 3, 4, 5, 6, 7, 8, 9]) == 8
    # a hit on a block another sequence holds costs no new block
    free_before = bm.num_available_blocks
    assert bm.allocate("b", [1, 2, 3, 4, 5, 6, 7, 8, 9]) == 8
    assert bm.num_available_blocks == free_before - 1
    assert [bm.ref_count(b) for b in bm.block_table("b")] == [2, 2, 1]


# ---------------------------------------------------------------------------- fork and copy-on-write
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_fork_and_copy_on_write(prefix_caching):
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=prefix_caching)
    initial = bm.num_free_blocks
    bm.allocate("A", [1, 2, 3, 4, 5, 6])
    bm.mark_computed("A", 6)
    full, half = bm.block_table("A")
    bm.fork("A", "B")
    assert bm.block_table("B") == [full, half]
    assert bm.ref_count(full) == 2 and bm.ref_count(half) == 2

    block, offset, copied_from = bm.append_slot("A", 7)
    assert copied_from == half and block != half and offset == 2     # copy first, then write
    assert bm.block_table("A") == [full, block]
    assert bm.blocks[block].token_ids == [5, 6, 7]
    assert bm.blocks[half].token_ids == [5, 6]                        # B's contents unchanged
    assert bm.ref_count(half) == 1 and bm.ref_count(block) == 1 and bm.ref_count(full) == 2

    assert bm.append_slot("B", 9) == (half, 2, None)                 # B alone now: in place
    assert bm.blocks[half].token_ids == [5, 6, 9]
    assert bm.slot_mapping("A", [0, 5, 6]) == [full * 4, block * 4 + 1, block * 4 + 2]
    assert bm.slot_mapping("B", [6]) == [half * 4 + 2]
    bm.audit()
    bm.free("A")
    bm.free("B")
    bm.audit()
    if prefix_caching:
        assert bm.num_free_blocks + bm.num_evictable_blocks == initial and bm.num_evictable_blocks == 1
    else:
        assert bm.num_free_blocks == initial
    assert bm.num_used_blocks == 0


def test_fork_with_full_last_block_needs_no_copy():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate("A", [1, 2, 3, 4])
    bm.fork("A", "B")
    block, offset, copied_from = bm.append_slot("B", 5)
    assert copied_from is None and offset == 0 and block not in bm.block_table("A")


# ---------------------------------------------------------------------------- recycling and eviction
def test_pool_recycles_and_evicted_hash_is_gone():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    prompts = [[100 * r + i for i in range(6)] for r in range(11)]
    for r in range(10):
        run_request(bm, r, prompts[r], [1000 * r + k for k in range(4)])
        assert bm.num_used_blocks == 0
        assert bm.num_free_blocks + bm.num_evictable_blocks == 8          # all free or evictable
        bm.audit()
    assert bm.num_evictions > 0
    bm.allocate(10, prompts[10])                                      # the 11th allocates
    bm.audit()
    bm.free(10)
    first_key = block_hash(None, prompts[0][:4])
    assert not bm.pool.is_registered(first_key)                                # evicted → entry removed
    assert bm.num_prefix_hit_tokens(prompts[0]) == 0               # a miss, not stale data
    assert bm.num_prefix_hit_tokens(prompts[9]) == 4               # a recent one still hits
    assert bm.allocate("again", prompts[0]) == 0


def test_lru_evicts_least_recently_used_first():
    bm = BlockManager(num_blocks=3, block_size=2, enable_prefix_caching=True)
    run_request(bm, "x", [1, 2, 3], [0])          # caches block [1,2]
    run_request(bm, "y", [5, 6, 7], [0])          # caches block [5,6]
    assert bm.num_evictable_blocks == 2 and bm.num_free_blocks == 1
    bm.allocate("x2", [1, 2, 9])                  # a hit touches [1,2] …
    bm.free("x2")                                 # … so [5,6] is now the least recently used
    bm.allocate("w", [20, 21, 22])                # 2 blocks: the free one + one eviction
    assert bm.num_evictions == 1
    assert bm.num_prefix_hit_tokens([5, 6, 7]) == 0
    assert bm.num_prefix_hit_tokens([1, 2, 3]) == 2
    bm.audit()


# ---------------------------------------------------------------------------- other operations
def test_allocation_on_demand_and_slot_mapping():
    bm = BlockManager(num_blocks=4, block_size=4)
    bm.allocate(0, [1, 2, 3])
    assert len(bm.block_table(0)) == 1
    bm.append_slot(0, 4)
    assert len(bm.block_table(0)) == 1                                # fills the block
    bm.append_slot(0, 5)
    table = bm.block_table(0)
    assert len(table) == 2                                            # a new block on demand
    assert bm.slot_mapping(0, range(5)) == [table[p // 4] * 4 + p % 4 for p in range(5)]
    with pytest.raises(ValueError, match="positions"):
        bm.slot_mapping(0, [5])


def test_exhaustion_is_reported_not_crashed():
    bm = BlockManager(num_blocks=2, block_size=2)
    assert not bm.can_allocate(5)
    with pytest.raises(NoFreeBlocksError):
        bm.allocate(0, [1, 2, 3, 4, 5])
    assert bm.num_free_blocks == 2                                    # nothing changed
    bm.allocate(0, [1, 2, 3, 4])
    assert not bm.can_append(0)
    with pytest.raises(NoFreeBlocksError):
        bm.append_slot(0, 5)
    with pytest.raises(NoFreeBlocksError):
        bm.append_slots(0, [5, 6])
    assert bm.num_slots(0) == 4
    bm.audit()


def test_truncate_rolls_back_slots_and_blocks():
    bm = BlockManager(num_blocks=8, block_size=4, enable_prefix_caching=True)
    bm.allocate("s", [1, 2, 3, 4, 5])
    bm.mark_computed("s", 5)
    slots = bm.append_slots("s", [6, 7, 8, 9, 10])                   # γ = 5 draft tokens
    assert len(slots) == 5 and bm.num_slots("s") == 10 and len(bm.block_table("s")) == 3
    bm.mark_computed("s", 10)
    dropped = bm.truncate("s", 6)                                     # keep 1 accepted token
    assert len(dropped) == 1 and bm.num_slots("s") == 6 and len(bm.block_table("s")) == 2
    second = bm.blocks[bm.block_table("s")[1]]
    assert second.token_ids == [5, 6] and second.hash is None          # no stale cache entry
    block, offset, _ = bm.append_slot("s", 42)
    assert block == second.block_id and offset == 2
    bm.audit()
    with pytest.raises(ValueError, match="num_tokens"):
        bm.truncate("s", 99)
    bm.free("s")
    assert bm.num_used_blocks == 0


def test_truncate_into_a_shared_block_copies_on_next_write():
    bm = BlockManager(num_blocks=8, block_size=4)
    bm.allocate("A", [1, 2, 3, 4, 5, 6, 7, 8])
    bm.fork("A", "B")
    bm.truncate("B", 6)
    last = bm.block_table("B")[1]
    assert bm.blocks[last].token_ids == [5, 6, 7, 8]                   # A's data untouched
    block, offset, copied_from = bm.append_slot("B", 99)
    assert copied_from == last and offset == 2
    assert bm.blocks[block].token_ids == [5, 6, 99]
    assert bm.blocks[last].token_ids == [5, 6, 7, 8]
    bm.audit()


def test_swap_out_and_in():
    bm = BlockManager(num_blocks=4, block_size=2, num_cpu_blocks=3)
    bm.allocate("s", [1, 2, 3])
    gpu = bm.block_table("s")
    out = bm.swap_out("s")
    assert list(out) == gpu and bm.is_swapped("s")
    assert bm.num_free_blocks == 4 and bm.num_free_cpu_blocks == 1
    with pytest.raises(ValueError, match="swapped"):
        bm.append_slot("s", 4)
    bm.allocate("other", [9, 9, 9, 9, 9, 9])                          # uses 3 of 4 blocks
    assert not bm.can_swap_in("s")
    bm.free("other")
    back = bm.swap_in("s")
    assert list(back) == list(out.values())
    assert bm.block_table("s") == list(back.values())
    assert [bm.blocks[b].token_ids for b in bm.block_table("s")] == [[1, 2], [3]]
    assert bm.num_free_cpu_blocks == 3
    bm.audit()
    bm.swap_out("s")
    bm.free("s")                                                      # freeing a swapped sequence
    assert bm.num_free_cpu_blocks == 3 and bm.num_free_blocks == 4
    bm.audit()


def test_bad_arguments_raise_value_errors():
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(num_blocks=4, block_size=0)
    with pytest.raises(ValueError, match="num_blocks"):
        BlockManager(num_blocks=-1, block_size=4)
    bm = BlockManager(num_blocks=4, block_size=4)
    with pytest.raises(ValueError, match="token_ids"):
        bm.allocate(0, [])
    bm.allocate(0, [1])
    with pytest.raises(ValueError, match="already"):
        bm.allocate(0, [1])
    with pytest.raises(ValueError, match="seq_id"):
        bm.free(1)
