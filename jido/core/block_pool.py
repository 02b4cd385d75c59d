"""BlockPool: the fixed set of KV cache blocks, their ref counts, the free queues and the prefix index."""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence

from jido.core.radix_tree import RadixNode, RadixTree
from jido.utils.hashing import BlockHash

BlockKey = tuple[int, BlockHash]  # (group, chained block hash)


class KVCacheBlock:
    """One block of ``block_size`` token slots in every layer's KV cache.

    A block is cached once it is full: ``block_hash`` (its key, ``(group, chained hash)``, which offload
    tiers store it under), ``token_ids``, and its place in the radix tree (``node``, block ``position``) are
    set then; they stay set while the block sits in the free queue so a later request can revive it,
    until the block is evicted.
    """

    __slots__ = ("block_id", "ref_cnt", "block_hash", "token_ids", "node", "position")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockKey | None = None
        self.token_ids: tuple[int, ...] | None = None
        self.node: RadixNode | None = None
        self.position = 0

    def __repr__(self) -> str:
        return f"KVCacheBlock(id={self.block_id}, ref_cnt={self.ref_cnt}, cached={self.block_hash is not None})"


class BlockPool:
    """Hands out blocks, takes them back, and indexes which cached blocks hold which prefixes (a radix tree).

    Free blocks wait in two queues: blocks that hold no cached prefix, handed out first, and cached
    blocks in least-recently-released order, evicted from the head only when the first queue is empty.
    A request frees its blocks tail first, and a block's holders all hold its parent position, so the
    head of the cached queue is always a leaf of the tree (or a spare copy of a position): shared prefixes
    are evicted after the branches that hang off them, as in SGLang's LRU eviction of unreferenced leaves.
    NOTE: a block is in a free queue exactly when its ref count is zero; in the cached one exactly when it
    is also in the tree.
    """

    def __init__(self, num_blocks: int, enable_caching: bool = True, block_size: int = 16, num_groups: int = 1) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_blocks)]
        self._free: OrderedDict[int, KVCacheBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._free_cached: OrderedDict[int, KVCacheBlock] = OrderedDict()
        self.index = RadixTree(block_size, num_groups)
        # Called with each cached block whose last reference goes: from then on allocate() may overwrite it.
        self.on_release: Callable[[KVCacheBlock], None] | None = None

    @property
    def num_free_blocks(self) -> int:
        return len(self._free) + len(self._free_cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by running requests (cached-but-free blocks count as free)."""
        return 1.0 - self.num_free_blocks / self.num_blocks

    def free_block_ids(self) -> list[int]:
        """Block ids in the order allocate() takes them (uncached first, then cached LRU); for tests and debugging."""
        return [*self._free, *self._free_cached]

    def allocate(self, num_blocks: int) -> list[KVCacheBlock]:
        """Take ``num_blocks`` free blocks, uncached ones first, then evicting the least recently released."""
        if num_blocks > self.num_free_blocks:
            raise ValueError(f"cannot allocate {num_blocks} blocks, only {self.num_free_blocks} free")
        taken = []
        for _ in range(num_blocks):
            _, block = (self._free or self._free_cached).popitem(last=False)
            self._evict(block)
            block.ref_cnt = 1
            taken.append(block)
        return taken

    def touch(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Take one more reference on blocks (a prefix-cache hit), reviving free ones."""
        for block in blocks:
            if block.ref_cnt == 0:
                del (self._free_cached if block.node is not None else self._free)[block.block_id]
            block.ref_cnt += 1

    def free(self, blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference from each block, in the given order; the last reference frees it."""
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"block {block.block_id} freed more times than it was taken")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if block.node is None:
                    self._free[block.block_id] = block
                    continue
                self._free_cached[block.block_id] = block
                if self.on_release is not None:
                    self.on_release(block)

    def cache_blocks(self, token_ids: Sequence[int], start: int, blocks: list[list[KVCacheBlock | None]],
                     keys: list[list[BlockKey]], hint: RadixNode | None = None) -> RadixNode:
        """Record that full blocks hold the prefix ``token_ids``: ``blocks[k][g]`` (None: none) holds block
        position ``start + k`` of group ``g``, under ``keys[k][g]``. Blocks cached already (prefix hits) stay
        as they are. ``hint`` and the result: see :meth:`RadixTree.insert`."""
        size = self.index.block_size
        new = []
        for k, (row, key_row) in enumerate(zip(blocks, keys)):
            tokens = tuple(token_ids[(start + k) * size:(start + k + 1) * size])
            new.append([_mark_cached(block, key, tokens) for block, key in zip(row, key_row)])
        return self.index.insert(token_ids, start, new, hint)

    def reset_prefix_cache(self) -> None:
        """Forget every cached prefix (blocks in use keep their contents)."""
        for block in self.blocks:
            block.block_hash = None
            block.token_ids = None
            block.node = None
        self.index.clear()
        self._free.update(self._free_cached)
        self._free_cached.clear()

    def _evict(self, block: KVCacheBlock) -> None:
        if block.node is None:
            return
        self.index.remove(block)
        block.block_hash = None
        block.token_ids = None


def _mark_cached(block: KVCacheBlock | None, key: BlockKey, tokens: tuple[int, ...]) -> KVCacheBlock | None:
    """The block with its key and tokens set, or None if there is none or it is cached already (a hit)."""
    if block is None or block.node is not None:
        return None
    block.block_hash, block.token_ids = key, tokens
    return block
