"""The radix tree as the prefix index: runs on edges, splits where prompts part, LRU eviction of leaves, and the
same hits as a hash index over the same cached blocks on random request streams."""
from __future__ import annotations

import random

from jido.core.kv_cache_manager import KVCacheManager
from jido.core.radix_tree import RadixNode
from jido.core.request import Request
from jido.core.sampling_params import SamplingParams


def make_request(req_id: str, token_ids: list[int]) -> Request:
    return Request(req_id, token_ids, SamplingParams(max_tokens=64))


def run_prompt(manager: KVCacheManager, request: Request) -> list[list[int]] | None:
    """Admit a request with its prefix hit and compute its whole prompt, as a step would; None if it does not fit."""
    hits, num_hit = manager.get_computed_blocks(request)
    if manager.allocate_slots(request, request.num_tokens - num_hit, hits) is None:
        return None
    request.num_computed_tokens = request.num_tokens
    manager.cache_full_blocks(request)
    return manager.get_block_ids(request.request_id)


def decode(manager: KVCacheManager, request: Request, token: int) -> bool:
    request.append_output_token(token)
    if manager.allocate_slots(request, 1) is None:
        return False
    request.num_computed_tokens += 1
    manager.cache_full_blocks(request)
    return True


def edges(node: RadixNode) -> dict:
    """The tree below ``node`` as nested {edge tokens: subtree}, for exact structure checks."""
    return {tuple(child.tokens): edges(child) for child in node.children.values()}


def test_edges_hold_runs_of_whole_blocks_and_split_where_prompts_part():
    manager = KVCacheManager(num_blocks=32, block_size=2)
    run_prompt(manager, make_request("a", [1, 2, 3, 4, 5, 6, 7]))
    assert edges(manager.pool.index.root) == {(1, 2, 3, 4, 5, 6): {}}
    run_prompt(manager, make_request("b", [1, 2, 3, 4, 8, 9, 0]))
    assert edges(manager.pool.index.root) == {(1, 2, 3, 4): {(5, 6): {}, (8, 9): {}}}
    run_prompt(manager, make_request("c", [1, 2, 7, 7, 7]))
    assert edges(manager.pool.index.root) == {(1, 2): {(3, 4): {(5, 6): {}, (8, 9): {}}, (7, 7): {}}}
    # The split moved blocks to the new upper node; a lookup still finds every one of them.
    hits, num_hit = manager.get_computed_blocks(make_request("d", [1, 2, 3, 4, 8, 9, 1]))
    assert [b.block_id for b in hits[0]] == [0, 1, 4] and num_hit == 6


def test_a_decoding_request_grows_its_leaf_instead_of_adding_a_node_per_block():
    manager = KVCacheManager(num_blocks=32, block_size=2)
    a = make_request("a", [1, 2, 3])
    run_prompt(manager, a)
    for token in range(10, 19):
        decode(manager, a, token)
    assert edges(manager.pool.index.root) == {(1, 2, 3, 10, 11, 12, 13, 14, 15, 16, 17, 18): {}}
    assert manager.pool.index.num_nodes() == 1


def test_a_shared_prefix_is_evicted_after_the_branches_that_hang_off_it():
    manager = KVCacheManager(num_blocks=8, block_size=2)
    shared = [1, 2, 3, 4]
    a, b = make_request("a", shared + [5, 6, 0]), make_request("b", shared + [7, 8, 0])
    assert run_prompt(manager, a) == [[0, 1, 2, 3]]
    assert run_prompt(manager, b) == [[0, 1, 4, 5]]
    manager.free(a)  # the shared blocks are still b's
    manager.free(b)
    assert manager.pool.free_block_ids() == [6, 7, 3, 5, 2, 4, 1, 0]
    evicted = []
    remove = manager.pool.index.remove
    manager.pool.index.remove = lambda block: (evicted.append(block.block_id), remove(block))
    manager.allocate_slots(make_request("e", [9] * 16), 16)
    # The uncached tails first, then a's branch, b's branch, and the shared prefix last, leaf by leaf.
    assert evicted == [2, 4, 1, 0]
    assert manager.pool.index.num_nodes() == 0


def test_copies_computed_at_once_keep_serving_hits_after_the_first_is_evicted():
    manager = KVCacheManager(num_blocks=6, block_size=2)
    a, b = make_request("a", [1, 2, 3, 4, 5]), make_request("b", [1, 2, 3, 4, 6])
    for request in (a, b):  # both admitted in one step: neither hits the other
        assert manager.allocate_slots(request, 5) is not None
    for request in (a, b):
        request.num_computed_tokens = 5
        manager.cache_full_blocks(request)
    assert manager.get_block_ids("a") == [[0, 1, 2]] and manager.get_block_ids("b") == [[3, 4, 5]]
    manager.free(a)
    manager.allocate_slots(make_request("x", [9] * 6), 6)  # evicts a's copies (0 and 1)
    hits, num_hit = manager.get_computed_blocks(make_request("c", [1, 2, 3, 4, 7]))
    assert [blk.block_id for blk in hits[0]] == [3, 4] and num_hit == 4


# -- the hash index as a reference -------------------------------------------------------------------
def reference_num_hit(manager: KVCacheManager, request: Request) -> int:
    """The hit a hash index over the same cached blocks finds: keys ``(group, chained hash)``, tokens checked,
    and the prefix-cache rule (full groups: every block before the hit; sliding: what the next query sees)."""
    if not manager.reads_prefix_cache(request):
        return 0
    size = manager.block_size
    cached = {(b.block_hash, b.token_ids) for b in manager.pool.blocks if b.block_hash is not None}

    def has(group: int, i: int) -> bool:
        return ((group, request.block_hashes[i]), tuple(request.all_token_ids[i * size:(i + 1) * size])) in cached

    for n in range((request.num_tokens - 1) // size, 0, -1):
        ok = True
        for group, window in enumerate(manager.sliding_windows):
            first = 0 if window is None else max(0, n * size - window + 1) // size
            ok = ok and all(has(group, i) for i in range(first, n))
        if ok:
            return n * size
    return 0


def check_leaf_first(manager: KVCacheManager, evicted_block) -> None:
    """An evicted full-group block is a spare copy of its position, or no later position holds a copy."""
    group = evicted_block.block_hash[0]
    if manager.sliding_windows[group] is not None:
        return
    node, i = evicted_block.node, evicted_block.position - evicted_block.node.start
    if len(node.blocks[i][group]) > 1:
        return
    stack, below = [node], []
    while stack:
        current = stack.pop()
        start = i + 1 if current is node else 0
        below += [copies[group] for copies in current.blocks[start:]]
        stack.extend(current.children.values())
    assert not any(below), f"block {evicted_block.block_id} evicted while later positions of its path are cached"


def random_stream(seed: int, sliding_windows: tuple[int | None, ...]) -> int:
    """Drive a small pool with random prompts over shared prefixes; every lookup matches the reference.

    Returns how many lookups hit, so the stream is known to exercise the cache.
    """
    rng = random.Random(seed)
    manager = KVCacheManager(num_blocks=40, block_size=2, sliding_windows=sliding_windows)
    remove = manager.pool.index.remove
    manager.pool.index.remove = lambda block: (check_leaf_first(manager, block), remove(block))
    prefixes = [[rng.randrange(50) for _ in range(12)] for _ in range(3)]
    running: list[Request] = []
    num_hits = 0
    for step in range(300):
        if running and (rng.random() < 0.4 or len(running) > 4):
            manager.free(running.pop(rng.randrange(len(running))))
            continue
        if running and rng.random() < 0.3:
            request = rng.choice(running)
            if not decode(manager, request, rng.randrange(50)):
                running.remove(request)
                manager.free(request)
            continue
        base = rng.choice(prefixes)
        request = make_request(str(step), base[:rng.randrange(1, 13)] + [rng.randrange(50) for _ in range(rng.randrange(1, 6))])
        num_hit = manager.get_computed_blocks(request)[1]
        assert num_hit == reference_num_hit(manager, request), f"step {step}"
        num_hits += num_hit > 0
        if rng.random() < 0.05:
            manager.reset_prefix_cache()
        elif run_prompt(manager, request) is not None:
            running.append(request)
    return num_hits


def test_hits_equal_a_hash_index_on_random_streams_with_one_full_group():
    assert all(random_stream(seed, (None,)) > 50 for seed in range(4))


def test_hits_equal_a_hash_index_on_random_streams_with_sliding_window_groups():
    assert all(random_stream(seed, (None, 3, 5)) > 30 for seed in range(4))


def test_hits_equal_a_hash_index_on_random_streams_with_only_sliding_groups():
    assert all(random_stream(seed, (4,)) > 30 for seed in range(4))
