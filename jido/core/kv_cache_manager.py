"""KVCacheManager: each request's block table, prefix-cache lookups and slot allocation."""
from __future__ import annotations

from jido.core.block_pool import BlockPool, KVCacheBlock
from jido.core.request import Request
from jido.utils.hashing import hash_block_tokens


class KVCacheManager:
    """Gives requests the blocks their tokens need, sharing full blocks whose prefixes are cached.

    A request's blocks are ``[prefix-cache hits..., newly allocated...]``; block ``i`` holds token
    positions ``i * block_size`` to ``(i + 1) * block_size - 1``.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self._num_cached_blocks: dict[str, int] = {}
        self.prefix_cache_queries = 0  # prompt tokens looked up
        self.prefix_cache_hits = 0  # of which found in the cache

    @property
    def usage(self) -> float:
        return self.pool.usage

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """The longest run of leading full blocks already cached, and how many tokens they cover.

        At least one token is always left to compute, because the step that computes it samples the
        next token. Nothing is taken: call :meth:`allocate_slots` with the blocks to keep them.
        """
        if not self.enable_caching:
            return [], 0
        self._update_block_hashes(request)
        max_hit_blocks = (request.num_tokens - 1) // self.block_size
        hits: list[KVCacheBlock] = []
        for i, block_hash in enumerate(request.block_hashes[:max_hit_blocks]):
            block = self.pool.get_cached_block(block_hash, self._block_tokens(request, i))
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       new_computed_blocks: list[KVCacheBlock] | None = None) -> list[KVCacheBlock] | None:
        """Make room for ``num_new_tokens`` more tokens; returns the newly allocated blocks, or None.

        ``new_computed_blocks`` are prefix-cache hits (from :meth:`get_computed_blocks`) to attach in
        front. On None nothing changed: the caller may preempt someone and try again.
        """
        computed = new_computed_blocks or []
        blocks = self.req_to_blocks.get(request.request_id, [])
        num_tokens = request.num_computed_tokens + len(computed) * self.block_size + num_new_tokens
        num_needed = -(-num_tokens // self.block_size) - len(blocks) - len(computed)
        # Hits sitting in the free queue stop being allocatable once we take them.
        num_revived = sum(1 for b in computed if b.ref_cnt == 0)
        if num_needed > self.pool.num_free_blocks - num_revived:
            return None
        if request.request_id not in self.req_to_blocks and self.enable_caching:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += len(computed) * self.block_size
        self.pool.touch(computed)
        new_blocks = self.pool.allocate(max(num_needed, 0))
        self.req_to_blocks[request.request_id] = blocks + computed + new_blocks
        self._num_cached_blocks.setdefault(request.request_id, 0)
        self._num_cached_blocks[request.request_id] += len(computed)
        return new_blocks

    def cache_full_blocks(self, request: Request) -> None:
        """Index the request's blocks that became full of computed tokens, for later prefix hits."""
        if not self.enable_caching:
            return
        blocks = self.req_to_blocks[request.request_id]
        num_full = min(request.num_computed_tokens // self.block_size, len(blocks))
        start = self._num_cached_blocks[request.request_id]
        if num_full <= start:
            return
        self._update_block_hashes(request)
        for i in range(start, num_full):
            self.pool.cache_block(blocks[i], request.block_hashes[i], self._block_tokens(request, i))
        self._num_cached_blocks[request.request_id] = num_full

    def free(self, request: Request) -> None:
        """Return a request's blocks. Tail blocks go first so that shared prefixes are evicted last."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self._num_cached_blocks.pop(request.request_id, None)
        self.pool.free(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]

    def reset_prefix_cache(self) -> None:
        self.pool.reset_prefix_cache()
        for req_id in self._num_cached_blocks:
            self._num_cached_blocks[req_id] = 0

    def _block_tokens(self, request: Request, index: int) -> tuple[int, ...]:
        start = index * self.block_size
        return tuple(request.all_token_ids[start:start + self.block_size])

    def _update_block_hashes(self, request: Request) -> None:
        num_full = request.num_tokens // self.block_size
        hashes = request.block_hashes
        for i in range(len(hashes), num_full):
            parent = hashes[i - 1] if i > 0 else None
            hashes.append(hash_block_tokens(parent, self._block_tokens(request, i)))
