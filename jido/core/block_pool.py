"""BlockPool: the fixed set of KV cache blocks, their ref counts, the LRU free queue and the hash index."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable

from jido.utils.hashing import BlockHash


class KVCacheBlock:
    """One block of ``block_size`` token slots in every layer's KV cache.

    ``block_hash`` and ``token_ids`` are set once the block is full and cached; they stay set while the
    block sits in the free queue so a later request can revive it, until the block is evicted.
    """

    __slots__ = ("block_id", "ref_cnt", "block_hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None
        self.token_ids: tuple[int, ...] | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, cached={self.block_hash is not None})"


class BlockPool:
    """Hands out blocks, takes them back, and remembers which full blocks hold which prefixes.

    Free blocks wait in one queue in eviction order: the head is evicted first. A block whose ref count
    drops to zero joins the tail, so cached blocks are reused in least-recently-freed (LRU) order.
    NOTE: a block is in the free queue exactly when its ref count is zero.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, KVCacheBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[BlockHash, KVCacheBlock] = {}
        # Called with each cached block whose last reference goes: from then on allocate() may overwrite it.
        self.on_release: Callable[[KVCacheBlock], None] | None = None

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by running requests (cached-but-free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def free_block_ids(self) -> list[int]:
        """Block ids in eviction order (head first); for tests and debugging."""
        return list(self._free)

    def get_cached_block(self, block_hash: BlockHash, token_ids: tuple[int, ...]) -> KVCacheBlock | None:
        """The cached block for this hash, if its tokens really match (hashes can collide)."""
        block = self._cached.get(block_hash)
        if block is None or block.token_ids != token_ids:
            return None
        return block

    def allocate(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` blocks from the head of the free queue, evicting their cached contents."""
        if num_blocks > len(self._free):
            raise ValueError(f"cannot allocate {num_blocks} blocks, only {len(self._free)} free")
        taken = []
        for _ in range(num_blocks):
            _, block = self._free.popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            taken.append(block)
        return taken

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take one more reference on blocks (a prefix-cache hit), reviving free ones."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block, in the given order; the last reference frees it."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"block {block.block_id} freed more times than it was taken")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                self._free[block.block_id] = block
                if block.block_hash is not None and self.on_release is not None:
                    self.on_release(block)

    def cache_block(self, block: KVCacheBlock, block_hash: BlockHash, token_ids: tuple[int, ...]) -> None:
        """Record that a full block holds the prefix named by ``block_hash``."""
        if not self.enable_caching or block.block_hash is not None:
            return
        block.block_hash = block_hash
        block.token_ids = token_ids
        # An identical block cached earlier keeps the index entry: both hold the same K/V.
        self._cached.setdefault(block_hash, block)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (blocks in use keep their contents)."""
        for block in self.blocks:
            block.block_hash = None
            block.token_ids = None
        self._cached.clear()

    def _evict(self, block: KVCacheBlock) -> None:
        if block.block_hash is None:
            return
        if self._cached.get(block.block_hash) is block:
            del self._cached[block.block_hash]
        block.block_hash = None
        block.token_ids = None
