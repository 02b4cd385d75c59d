"""KVCacheManager: each request's block tables (one per layer group), prefix-cache lookups and slot allocation."""
from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from jido.core.block_pool import BlockPool, KVCacheBlock
from jido.core.kv_connector import ReleasedBlock
from jido.core.radix_tree import Copies, RadixNode
from jido.core.request import Request
from jido.utils.hashing import BlockHash, hash_block_tokens

# A request's block table per group: ``None`` marks a sliding-window block that is no longer held.
BlockTable = list[KVCacheBlock | None]
NULL_BLOCK_ID = 0  # what the runner sees for a released position; never read (outside every window)


class KVCacheManager:
    """Gives requests the blocks their tokens need in every layer group, sharing cached prefixes.

    Groups come from :func:`jido.core.kv_cache_spec.group_layers`: ``sliding_windows[g]`` is ``None`` for
    a full-attention group and the window for a sliding one. All groups draw from one :class:`BlockPool`.
    In each group, block ``i`` of a request holds token positions ``i * block_size`` to
    ``(i + 1) * block_size - 1``; a sliding group releases the blocks its window has passed (the position
    stays in the table as ``None``), so it holds about ``window / block_size`` blocks however long the
    request grows.

    Prefix-cache rule: a hit of ``n`` blocks needs, in every full group, blocks ``0..n-1`` cached, and in
    every sliding group the blocks that the query at position ``n * block_size`` can see (the last
    ``window - 1`` keys before it); earlier blocks of a sliding group are not needed and stay ``None``.
    The pool's radix tree finds the cached blocks along a prompt's tokens, per group (each group's blocks
    hold other layers' K/V); their keys, ``(group, chained block hash)``, name them to offload tiers.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True,
                 sliding_windows: Sequence[int | None] = (None,)) -> None:
        if not sliding_windows:
            raise ValueError("the KV cache needs at least one layer group")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.sliding_windows = tuple(sliding_windows)
        self.pool = BlockPool(num_blocks, enable_caching, block_size, len(self.sliding_windows))
        self.req_to_blocks: dict[str, list[BlockTable]] = {}
        self._num_cached_blocks: dict[str, int] = {}  # leading positions already indexed, in every group
        self._tree_nodes: dict[str, RadixNode] = {}  # where each request's indexed path ends, to resume there
        self._num_released: dict[str, list[int]] = {}  # per group, leading positions already released
        self.prefix_cache_queries = 0  # prompt tokens looked up
        self.prefix_cache_hits = 0  # of which found in the cache

    @property
    def num_groups(self) -> int:
        return len(self.sliding_windows)

    @property
    def usage(self) -> float:
        return self.pool.usage

    # -- prefix cache ---------------------------------------------------------------------------
    def get_computed_blocks(self, request: Request) -> tuple[list[BlockTable], int]:
        """Per group, the cached blocks of the longest usable prefix, and how many tokens it covers.

        At least one token is always left to compute, because the step that computes it samples the
        next token. A request that still owes its prompt's logprobs gets no hit (as in vLLM): they come
        from computing every prompt token. Nothing is taken: call :meth:`allocate_slots` with the blocks
        to keep them.
        """
        if not self.reads_prefix_cache(request):
            return [[] for _ in self.sliding_windows], 0
        self._update_block_hashes(request)
        limit = (request.num_tokens - 1) // self.block_size
        path = self.pool.index.match(request.all_token_ids, limit)
        cached = [self._cached_run(path, group) for group in range(self.num_groups)]
        # Only the full groups' common cached prefix can be used, which bounds the sliding groups' runs.
        limit = min([len(path)] + [len(cached[g]) for g in range(self.num_groups) if self.sliding_windows[g] is None])
        num_hit = self._longest_hit(cached, limit)
        hits = [self._hit_table(g, blocks, num_hit) for g, blocks in enumerate(cached)]
        return hits, num_hit * self.block_size

    def reads_prefix_cache(self, request: Request) -> bool:
        """Whether the request may start from cached KV (device or external): not while it owes prompt logprobs."""
        return self.enable_caching and not owes_prompt_logprobs(request)

    def cached_blocks(self, token_ids: list[int]) -> list[BlockTable]:
        """Per group, the cached block at each whole-block position of ``token_ids`` (None where there is none;
        full groups end at their first miss). Nothing is taken: see :meth:`hold_blocks`."""
        path = self.pool.index.match(token_ids, len(token_ids) // self.block_size)
        return [self._cached_run(path, group) for group in range(self.num_groups)]

    def num_cached_tokens(self, token_ids: list[int]) -> int:
        """Leading tokens of ``token_ids`` whose whole blocks are cached in every group."""
        tables = self.cached_blocks(token_ids)
        num = min(len(t) for t in tables)
        return next((i for i in range(num) if any(t[i] is None for t in tables)), num) * self.block_size

    def hold_blocks(self, blocks: list[KVCacheBlock]) -> None:
        """Take a reference on cached blocks outside any request's table (a blend's sources), reviving free ones."""
        self.pool.touch(blocks)

    def release_blocks(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop the references :meth:`hold_blocks` took, in the given order."""
        self.pool.free(blocks)

    def _cached_run(self, path: list[Copies], group: int) -> BlockTable:
        """The group's cached block at each position of the matched path (None where it has none).

        A full group stops at its first hole: only a prefix of it can ever be used. Of several copies, one
        that is held already is taken, so the hit revives no free block.
        """
        found: BlockTable = []
        for copies in path:
            blocks = copies[group]
            if not blocks and self.sliding_windows[group] is None:
                break
            found.append(next((b for b in blocks if b.ref_cnt > 0), blocks[0]) if blocks else None)
        return found

    def _longest_hit(self, cached: list[BlockTable], limit: int) -> int:
        """The most blocks ``n <= limit`` that every sliding group can serve (see the prefix-cache rule)."""
        runs = {g: _run_lengths(blocks[:limit]) for g, blocks in enumerate(cached)
                if self.sliding_windows[g] is not None}
        for n in range(limit, 0, -1):
            if all(self._window_cached(self.sliding_windows[g], run, n) for g, run in runs.items()):
                return n
        return 0

    def _window_cached(self, window: int, run: list[int], n: int) -> bool:
        """Whether the blocks the query at ``n * block_size`` sees all sit at the end of a cached run."""
        need = n - self._num_dead_blocks(window, n * self.block_size)
        return need == 0 or run[n - 1] >= need

    def _hit_table(self, group: int, blocks: BlockTable, num_hit: int) -> BlockTable:
        window = self.sliding_windows[group]
        first = 0 if window is None else self._num_dead_blocks(window, num_hit * self.block_size)
        return [None] * first + blocks[first:num_hit]

    # -- allocation -----------------------------------------------------------------------------
    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[BlockTable] | None = None,
                       num_lookahead_tokens: int = 0) -> list[list[KVCacheBlock]] | None:
        """Make room for ``num_new_tokens`` (+ ``num_lookahead_tokens``) more tokens in every group.

        Returns the newly allocated blocks per group, or None when the pool is too small; then only the
        blocks that sliding windows had already passed were released, and the caller may preempt
        someone and try again. ``new_computed_blocks`` are prefix-cache hits (from
        :meth:`get_computed_blocks`) to attach in front, on the request's first allocation.
        """
        computed = new_computed_blocks or [[] for _ in self.sliding_windows]
        num_hit = len(computed[0]) * self.block_size
        num_tokens = request.num_computed_tokens + num_hit + num_new_tokens + num_lookahead_tokens
        num_positions = -(-num_tokens // self.block_size)
        tables = self.req_to_blocks.get(request.request_id)
        if tables is not None:
            self._release_dead_blocks(request, tables)
            if num_positions <= min(len(t) for t in tables):
                return [[] for _ in tables]  # most decode steps: the last blocks still have room
        held = [len(t) for t in tables] if tables is not None else [len(c) for c in computed]
        num_needed = sum(max(num_positions - n, 0) for n in held)
        # Hits sitting in the free queue stop being allocatable once we take them.
        num_revived = sum(1 for blocks in computed for b in blocks if b is not None and b.ref_cnt == 0)
        if num_needed > self.pool.num_free_blocks - num_revived:
            return None
        if tables is None:
            tables = self._start_tables(request, computed)
        new_blocks = []
        for table in tables:
            new = self.pool.allocate(max(num_positions - len(table), 0))
            table.extend(new)
            new_blocks.append(new)
        return new_blocks

    def _start_tables(self, request: Request, computed: list[BlockTable]) -> list[BlockTable]:
        if self.reads_prefix_cache(request):
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += len(computed[0]) * self.block_size
        self.pool.touch(b for blocks in computed for b in blocks if b is not None)
        tables = [list(blocks) for blocks in computed]
        self.req_to_blocks[request.request_id] = tables
        self._num_cached_blocks[request.request_id] = len(computed[0])
        # A hit on a sliding group starts with positions it never held (None).
        self._num_released[request.request_id] = [next((i for i, b in enumerate(t) if b is not None), len(t))
                                                  for t in tables]
        return tables

    def has_blocks(self, request_id: str) -> bool:
        """Whether the request holds block tables (it was allocated and not freed since)."""
        return request_id in self.req_to_blocks

    def set_release_listener(self, listener: Callable[[ReleasedBlock], None]) -> None:
        """Call ``listener`` with each cached block no request holds any more (the pool may reuse it from then on)."""
        self.pool.on_release = lambda block: listener(ReleasedBlock(block.block_id, block.block_hash, block.token_ids))

    def release_dead_blocks(self, request: Request) -> None:
        """Free the sliding-window blocks ``request.num_computed_tokens`` has passed (after an external load)."""
        self._release_dead_blocks(request, self.req_to_blocks[request.request_id])

    def _release_dead_blocks(self, request: Request, tables: list[BlockTable]) -> None:
        # Only positions that died since the last call are looked at: the work per step stays constant.
        released = self._num_released[request.request_id]
        for group, (window, table) in enumerate(zip(self.sliding_windows, tables)):
            if window is None:
                continue
            dead = self._num_dead_blocks(window, request.num_computed_tokens)
            if dead <= released[group]:
                continue
            blocks = [b for b in table[released[group]:dead] if b is not None]
            table[released[group]:dead] = [None] * (dead - released[group])
            released[group] = dead
            self.pool.free(reversed(blocks))

    def _num_dead_blocks(self, window: int, num_computed_tokens: int) -> int:
        # The query at num_computed_tokens sees keys from num_computed_tokens - window + 1 on.
        return max(0, num_computed_tokens - window + 1) // self.block_size

    def cache_full_blocks(self, request: Request) -> None:
        """Index the request's blocks that became full of computed, known tokens, for later prefix hits.

        Computed proposals the request does not hold as tokens yet wait for a later call.
        """
        if not self.enable_caching:
            return
        tables = self.req_to_blocks[request.request_id]
        num_known = min(request.num_computed_tokens, request.num_tokens)
        if request.kv_blend is not None:  # blended KV is not what a prefill of these tokens computes
            num_known = min(num_known, request.kv_blend.num_exact_tokens)
        num_full = min(num_known // self.block_size, *(len(t) for t in tables))
        start = self._num_cached_blocks[request.request_id]
        if num_full <= start:
            return
        self._update_block_hashes(request)
        blocks = [[table[i] for table in tables] for i in range(start, num_full)]
        keys = [[(group, request.block_hashes[i]) for group in range(self.num_groups)] for i in range(start, num_full)]
        self._tree_nodes[request.request_id] = self.pool.cache_blocks(
            request.all_token_ids, start, blocks, keys, self._tree_nodes.get(request.request_id))
        self._num_cached_blocks[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Return a request's blocks. Tail blocks go first so that shared prefixes are evicted last."""
        tables = self.req_to_blocks.pop(request.request_id, [])
        self._num_cached_blocks.pop(request.request_id, None)
        self._tree_nodes.pop(request.request_id, None)
        self._num_released.pop(request.request_id, None)
        for table in tables:
            self.pool.free(b for b in reversed(table) if b is not None)

    def get_block_ids(self, request_id: str) -> list[list[int]]:
        """The request's block ids per group; released sliding-window positions read ``NULL_BLOCK_ID``."""
        return [[NULL_BLOCK_ID if b is None else b.block_id for b in table]
                for table in self.req_to_blocks.get(request_id, [])]

    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()
        self._tree_nodes.clear()
        for req_id in self._num_cached_blocks:
            self._num_cached_blocks[req_id] = 0

    def _block_tokens(self, request: Request, index: int) -> tuple[int, ...]:
        start = index * self.block_size
        return tuple(request.all_token_ids[start:start + self.block_size])

    def _update_block_hashes(self, request: Request) -> None:
        num_full = request.num_tokens // self.block_size
        hashes: list[BlockHash] = request.block_hashes
        for i in range(len(hashes), num_full):
            parent = hashes[i - 1] if i > 0 else None
            hashes.append(hash_block_tokens(parent, self._block_tokens(request, i)))


def owes_prompt_logprobs(request: Request) -> bool:
    """Whether the request still has to compute every prompt token to score it (so it may load no KV)."""
    # NOTE: the runner takes a new request with outputs as one whose prompt logprobs were sent.
    return request.sampling_params.prompt_logprobs is not None and not request.output_token_ids


def positions_to_load(window: int | None, block_size: int, num_computed_tokens: int, num_tokens: int) -> range:
    """The block positions of one group that KV for tokens ``num_computed_tokens..num_tokens - 1`` fills, when
    the next query sits at ``num_tokens``: all of them in a full group; in a sliding group only those the
    query can still see (the prefix-cache rule above). ``num_computed_tokens`` is a multiple of the block size."""
    first = num_computed_tokens // block_size
    if window is not None:
        first = max(first, max(0, num_tokens - window + 1) // block_size)
    return range(first, -(-num_tokens // block_size))


def _run_lengths(blocks: BlockTable) -> list[int]:
    """For each position, how many consecutive cached blocks end there."""
    runs, run = [], 0
    for block in blocks:
        run = run + 1 if block is not None else 0
        runs.append(run)
    return runs
