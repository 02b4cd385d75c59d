"""ChunkBlends: the cached blocks of a blend request's chunks, found and held for the step that blends them."""
from __future__ import annotations

from jido.core.block_pool import KVCacheBlock
from jido.core.kv_blend import NOT_CACHED, BlendChunk, BlendPlan
from jido.core.kv_cache_manager import KVCacheManager
from jido.core.request import Request


class ChunkBlends:
    """Finds each chunk's cached blocks for a blend request's prefill step and holds them until the step is done.

    Holding keeps the pool from evicting or reusing a source block while the runner reads it. In full
    groups a chunk's whole cached path is held, head included, so the blocks are released deepest first
    and eviction still reaches leaves first.
    """

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self._held: dict[str, list[KVCacheBlock]] = {}

    def plan(self, request: Request, num_computed_tokens: int) -> BlendPlan | None:
        """Hold the cached blocks of the chunks past ``num_computed_tokens``; None when no chunk is left to blend."""
        spec = request.kv_blend
        held: list[KVCacheBlock] = []
        chunks = []
        for i, (start, end) in enumerate(spec.spans()):
            if end <= num_computed_tokens:
                continue  # a prefix-cache hit covers it, exactly
            tables = self.kv.cached_blocks(spec.standalone(request.all_token_ids, i))
            first = spec.prefix_len // self.kv.block_size
            held += [b for g, table in enumerate(tables) for b in self._held_part(g, table, first) if b is not None]
            ids = [[NOT_CACHED if b is None else b.block_id for b in table] for table in tables]
            chunks.append(BlendChunk(start, spec.prefix_len, end - start, ids))
        if not chunks:
            return None
        self.kv.hold_blocks(held)
        self._held[request.request_id] = held
        return BlendPlan(chunks, spec.recompute_ratio)

    def _held_part(self, group: int, table: list[KVCacheBlock | None], first: int) -> list[KVCacheBlock | None]:
        # Full groups: the whole path from the root, so no head block is released after the chunk's blocks.
        return table if self.kv.sliding_windows[group] is None else table[first:]

    def release(self, req_id: str) -> None:
        """The blend step is done: let the pool have the source blocks back (deepest first)."""
        self.kv.release_blocks(reversed(self._held.pop(req_id, [])))
