"""Block pool and KV cache manager: exact block ids, ref counts, prefix hits and LRU eviction order."""
from __future__ import annotations

import pytest

from jido.core.block_pool import BlockPool
from jido.core.kv_cache_manager import KVCacheManager
from jido.core.request import Request
from jido.core.sampling_params import SamplingParams
from jido.utils.hashing import hash_block_tokens


def make_request(req_id: str, token_ids: list[int]) -> Request:
    return Request(req_id, token_ids, SamplingParams(max_tokens=8))


def allocate_prompt(manager: KVCacheManager, request: Request) -> list[list[int]]:
    hits, num_hit_tokens = manager.get_computed_blocks(request)
    assert manager.allocate_slots(request, request.num_tokens - num_hit_tokens, hits) is not None
    request.num_computed_tokens = request.num_tokens
    manager.cache_full_blocks(request)
    return manager.get_block_ids(request.request_id)


def test_allocate_takes_blocks_from_the_head_in_id_order():
    pool = BlockPool(6)
    assert [b.block_id for b in pool.allocate(3)] == [0, 1, 2]
    assert pool.free_block_ids() == [3, 4, 5]
    assert pool.num_free_blocks == 3


def test_freed_blocks_join_the_tail_of_the_free_queue():
    pool = BlockPool(4)
    blocks = pool.allocate(4)
    pool.free([blocks[2], blocks[0]])
    assert pool.free_block_ids() == [2, 0]
    assert [b.block_id for b in pool.allocate(1)] == [2]


def test_shared_block_is_freed_only_by_its_last_reference():
    pool = BlockPool(2)
    (block,) = pool.allocate(1)
    pool.touch([block])
    assert block.ref_cnt == 2
    pool.free([block])
    assert pool.free_block_ids() == [1]
    pool.free([block])
    assert pool.free_block_ids() == [1, 0]
    with pytest.raises(RuntimeError, match="freed more times"):
        pool.free([block])


def test_allocating_more_than_free_raises():
    pool = BlockPool(2)
    with pytest.raises(ValueError, match="only 2 free"):
        pool.allocate(3)


def test_block_hash_chains_the_parent_hash():
    first = hash_block_tokens(None, (1, 2))
    assert hash_block_tokens(first, (3, 4)) != hash_block_tokens(None, (3, 4))
    assert hash_block_tokens(first, (3, 4)) == hash_block_tokens(hash_block_tokens(None, [1, 2]), [3, 4])


def test_prefix_hit_reuses_leading_full_blocks_and_counts_tokens():
    manager = KVCacheManager(num_blocks=10, block_size=4)
    a = make_request("a", list(range(10)))  # blocks: [0..3] [4..7] [8, 9]
    assert allocate_prompt(manager, a) == [[0, 1, 2]]
    b = make_request("b", list(range(8)) + [99, 98, 97])
    hits, num_hit_tokens = manager.get_computed_blocks(b)
    assert [blk.block_id for blk in hits[0]] == [0, 1] and num_hit_tokens == 8
    manager.allocate_slots(b, b.num_tokens - 8, hits)
    assert manager.get_block_ids("b") == [[0, 1, 3]]
    assert [manager.pool.blocks[i].ref_cnt for i in (0, 1, 2, 3)] == [2, 2, 1, 1]
    assert manager.prefix_cache_queries == 21 and manager.prefix_cache_hits == 8


def test_a_hit_always_leaves_one_token_to_compute():
    manager = KVCacheManager(num_blocks=10, block_size=4)
    allocate_prompt(manager, make_request("a", list(range(8))))
    hits, num_hit_tokens = manager.get_computed_blocks(make_request("b", list(range(8))))
    assert [blk.block_id for blk in hits[0]] == [0] and num_hit_tokens == 4


def test_freed_prefix_stays_reusable_until_evicted_in_lru_order():
    manager = KVCacheManager(num_blocks=6, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5])
    assert allocate_prompt(manager, a) == [[0, 1, 2]]
    manager.free(a)
    # Tail blocks are freed first, so the prefix's first block is evicted last.
    assert manager.pool.free_block_ids() == [3, 4, 5, 2, 1, 0]
    b = make_request("b", [1, 2, 3, 4, 9])
    hits, num_hit_tokens = manager.get_computed_blocks(b)
    assert [blk.block_id for blk in hits[0]] == [0, 1] and num_hit_tokens == 4
    manager.allocate_slots(b, 1, hits)
    assert manager.get_block_ids("b") == [[0, 1, 3]]
    c = make_request("c", [7, 7, 7, 7, 7])
    assert allocate_prompt(manager, c) == [[4, 5, 2]]
    manager.free(c)
    manager.free(b)
    # Uncached blocks (the partial tails 2 and 3) are handed out before any cached block is evicted; with
    # the one LRU queue of the hash index, 3 came after c's cached 5 and 4.
    assert manager.pool.free_block_ids() == [2, 3, 5, 4, 1, 0]
    # Four new blocks evict the least recently freed: c's cached prefix goes, a's survives.
    manager.allocate_slots(make_request("e", [0] * 8), 8)
    assert manager.get_computed_blocks(make_request("c2", [7, 7, 7, 7, 7]))[1] == 0
    assert manager.get_computed_blocks(make_request("a2", [1, 2, 3, 4, 5]))[1] == 4


def test_eviction_forgets_the_hash():
    manager = KVCacheManager(num_blocks=2, block_size=2)
    a = make_request("a", [1, 2, 3])
    allocate_prompt(manager, a)
    manager.free(a)
    b = make_request("b", [5, 6, 7])
    allocate_prompt(manager, b)  # takes both blocks, evicting a's cached [1, 2]
    manager.free(b)
    hits, _ = manager.get_computed_blocks(make_request("c", [1, 2, 3]))
    assert hits == [[]]


def test_a_block_that_differs_in_one_token_is_not_a_hit():
    manager = KVCacheManager(num_blocks=8, block_size=2)
    allocate_prompt(manager, make_request("a", [1, 2, 3, 4, 5]))
    hits, num_hit_tokens = manager.get_computed_blocks(make_request("b", [1, 2, 3, 9, 5]))
    assert [blk.block_id for blk in hits[0]] == [0] and num_hit_tokens == 2
    assert manager.get_computed_blocks(make_request("c", [2, 1, 3, 4, 5]))[1] == 0


def test_allocation_fails_without_side_effects_when_blocks_run_out():
    manager = KVCacheManager(num_blocks=3, block_size=2)
    a = make_request("a", [1, 2, 3, 4])
    allocate_prompt(manager, a)
    b = make_request("b", [5, 6, 7, 8])
    assert manager.allocate_slots(b, 4) is None
    assert manager.get_block_ids("b") == [] and manager.pool.free_block_ids() == [2]


def test_revived_free_hits_count_against_free_blocks():
    manager = KVCacheManager(num_blocks=3, block_size=2)
    a = make_request("a", [1, 2, 3, 4, 5])
    allocate_prompt(manager, a)
    manager.free(a)
    b = make_request("b", [1, 2, 3, 4, 6, 7, 8])
    hits, n = manager.get_computed_blocks(b)
    assert n == 4
    # 2 hits revived from the free queue leave 1 free block; b needs 2 more.
    assert manager.allocate_slots(b, 3, hits) is None
    assert [blk.ref_cnt for blk in hits[0]] == [0, 0]
