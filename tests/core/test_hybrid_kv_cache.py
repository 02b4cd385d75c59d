"""KV cache groups: sliding-window groups release blocks behind the window; prefix hits follow the window rule."""
from __future__ import annotations

from jido.core.kv_cache_manager import KVCacheManager
from jido.core.kv_cache_spec import (FullAttentionSpec, SlidingWindowSpec, blocks_per_request, group_layers,
                                     make_kv_cache_config)
from jido.core.request import Request
from jido.core.sampling_params import SamplingParams


def make_request(req_id: str, token_ids: list[int]) -> Request:
    return Request(req_id, token_ids, SamplingParams(max_tokens=64))


def compute(manager: KVCacheManager, request: Request, num_new: int, hits=None) -> None:
    """Allocate for ``num_new`` tokens, then mark them computed and cached, as a step would."""
    assert manager.allocate_slots(request, num_new, hits) is not None
    request.num_computed_tokens += num_new + (0 if hits is None else len(hits[0]) * manager.block_size)
    manager.cache_full_blocks(request)


def evict(manager: KVCacheManager, block_ids: set[int]) -> None:
    """Evict these cached free blocks through the pool's own API: hold every other free block, allocate."""
    pool = manager.pool
    others = [b for b in pool.blocks if b.ref_cnt == 0 and b.node is not None and b.block_id not in block_ids]
    pool.touch(others)
    taken = pool.allocate(pool.num_free_blocks)  # the uncached ones first, then the targets: evicted
    pool.free(taken)
    pool.free(others)


def decode(manager: KVCacheManager, request: Request, token: int = 5) -> None:
    request.append_output_token(token)
    compute(manager, request, 1)


def test_sliding_group_releases_blocks_the_window_has_passed():
    # block_size 4, window 4: the query at p sees keys p-3..p, so blocks ending before p-3 are dead.
    manager = KVCacheManager(num_blocks=20, block_size=4, sliding_windows=(None, 4))
    a = make_request("a", list(range(12)))
    compute(manager, a, 12)
    assert manager.get_block_ids("a") == [[0, 1, 2], [3, 4, 5]]
    decode(manager, a)  # the query at 12 sees 9..12: blocks 0 and 1 are dead
    assert manager.get_block_ids("a") == [[0, 1, 2, 6], [0, 0, 5, 7]]
    assert manager.pool.free_block_ids()[-2:] == [4, 3]  # released tail first, kept for prefix hits
    for _ in range(8):
        decode(manager, a)
    full, sliding = manager.req_to_blocks["a"]
    assert len(full) == 6 and sum(b is not None for b in sliding) == 2
    assert manager.usage == 8 / 20
    manager.free(a)
    assert manager.usage == 0.0


def test_sliding_group_holds_window_plus_one_block_however_long_the_request():
    manager = KVCacheManager(num_blocks=200, block_size=4, sliding_windows=(None, 10))
    a = make_request("a", list(range(7)))
    compute(manager, a, 7)
    for step in range(100):
        decode(manager, a, token=step)
        live = sum(b is not None for b in manager.req_to_blocks["a"][1])
        assert live <= SlidingWindowSpec(4, 1, 8, 4, sliding_window=10).num_live_blocks(a.num_tokens) + 1


def test_prefix_hit_on_window_layers_needs_only_the_blocks_the_next_query_sees():
    manager = KVCacheManager(num_blocks=20, block_size=4, sliding_windows=(None, 4))
    a = make_request("a", list(range(16)))
    compute(manager, a, 16)
    manager.free(a)
    b = make_request("b", list(range(16)) + [99])
    hits, num_hit_tokens = manager.get_computed_blocks(b)
    assert num_hit_tokens == 16
    assert [blk.block_id for blk in hits[0]] == [0, 1, 2, 3]
    # The query at 16 sees keys 13..16: only the block of 12..15 is needed in the sliding group.
    assert [None if blk is None else blk.block_id for blk in hits[1]] == [None, None, None, 7]
    compute(manager, b, 1, hits)
    assert manager.get_block_ids("b") == [[0, 1, 2, 3, 8], [0, 0, 0, 7, 9]]


def test_a_missing_window_block_shortens_the_hit_to_where_the_window_is_cached():
    manager = KVCacheManager(num_blocks=20, block_size=4, sliding_windows=(None, 4))
    a = make_request("a", list(range(16)))
    compute(manager, a, 16)
    manager.free(a)
    evict(manager, {7})  # the sliding block of 12..15
    hits, num_hit_tokens = manager.get_computed_blocks(make_request("b", list(range(16)) + [99]))
    assert num_hit_tokens == 12  # the query at 12 sees 9..12: blocks 2 (8..11) is cached
    assert [None if blk is None else blk.block_id for blk in hits[1]] == [None, None, 6]


def test_groups_cache_under_their_own_ids_so_a_full_hit_never_serves_a_window_layer():
    manager = KVCacheManager(num_blocks=20, block_size=4, sliding_windows=(None, 4))
    a = make_request("a", list(range(16)))
    compute(manager, a, 16)
    manager.free(a)
    evict(manager, {4, 5, 6, 7})  # every sliding block of a
    assert manager.get_computed_blocks(make_request("b", list(range(16)) + [99]))[1] == 0


def test_layers_are_grouped_by_spec_in_groups_of_the_smallest_kind():
    full = FullAttentionSpec(16, 1, 256, 4)
    sliding = SlidingWindowSpec(16, 1, 256, 4, sliding_window=512)
    # Gemma 3 270M: every 6th layer global.
    specs = {i: full if (i + 1) % 6 == 0 else sliding for i in range(18)}
    groups, size = group_layers(specs)
    assert size == 3
    assert [g.layer_ids for g in groups] == [(5, 11, 17), (0, 1, 2), (3, 4, 6), (7, 8, 9), (10, 12, 13),
                                             (14, 15, 16)]


def test_gemma3_270m_fits_five_times_the_full_length_requests_of_one_table_for_all_layers():
    full = FullAttentionSpec(16, 1, 256, 4)
    sliding = SlidingWindowSpec(16, 1, 256, 4, sliding_window=512)
    hybrid = make_kv_cache_config({i: full if (i + 1) % 6 == 0 else sliding for i in range(18)}, 2 * 2**30)
    uniform = make_kv_cache_config({i: full for i in range(18)}, 2 * 2**30)
    hybrid_fit = hybrid.num_blocks / blocks_per_request(hybrid, 32768)
    uniform_fit = uniform.num_blocks / blocks_per_request(uniform, 32768)
    assert round(uniform_fit, 2) == 1.78
    assert hybrid_fit >= 5 * uniform_fit
