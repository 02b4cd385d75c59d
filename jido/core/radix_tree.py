"""RadixTree: the prefix index over cached blocks (SGLang's RadixAttention) — token runs on edges, whole blocks."""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Protocol


class CachedBlock(Protocol):
    """What the tree keeps of a pool block (``jido.core.block_pool.KVCacheBlock``): where it sits, and its group."""

    node: RadixNode | None
    position: int  # block position in the prompt
    block_hash: tuple  # its key, (group, chained hash)


# Per block position, per layer group: the cached blocks that hold that position (see RadixNode).
Copies = list[list[CachedBlock]]


class RadixNode:
    """One edge of the tree: a run of whole blocks of tokens, and the cached blocks along it.

    ``tokens`` is the run from the parent's end to this node's end, ``len(blocks) * block_size`` tokens;
    block ``i`` of the run is block position ``start + i`` of every prompt that passes here.
    ``blocks[i][g]`` lists the pool blocks of layer group ``g`` that hold that position: usually one, more
    when requests that computed the same prefix at once each cached their own copy, none (a hole) where a
    sliding-window block was evicted while later positions stayed. Children are keyed by their first
    block's tokens.
    NOTE: a detached node has ``start == -1``; a request's remembered node is checked for it before use.
    """

    __slots__ = ("parent", "tokens", "start", "blocks", "children")

    def __init__(self, parent: RadixNode | None, tokens: list[int], start: int, blocks: list[Copies]) -> None:
        self.parent = parent
        self.tokens = tokens
        self.start = start
        self.blocks = blocks
        self.children: dict[tuple[int, ...], RadixNode] = {}

    @property
    def end(self) -> int:
        """The block position just past this node's run."""
        return self.start + len(self.blocks)

    def __repr__(self) -> str:
        return f"RadixNode(start={self.start}, num_blocks={len(self.blocks)}, children={len(self.children)})"


class RadixTree:
    """Which cached blocks hold which prompt prefixes, walked token by token from the root.

    A lookup follows the prompt's whole blocks down the edges and returns, for each block position on
    the longest matching path, the cached copies per layer group; tokens are compared, so a hit is never
    a hash collision. Eviction is the block pool's: it removes a block here when it reuses it, and a node
    left without blocks and children is pruned, so the paths that remain lead to cached blocks.
    """

    def __init__(self, block_size: int, num_groups: int) -> None:
        self.block_size = block_size
        self.num_groups = num_groups
        self.root = RadixNode(None, [], 0, [])

    def match(self, token_ids: Sequence[int], num_blocks: int) -> list[Copies]:
        """The copies per group at each block position ``0..m-1`` of the longest path matching the first
        ``num_blocks`` whole blocks of ``token_ids`` (``m <= num_blocks``). The lists are the tree's own:
        read them, never change them."""
        node, i, path = self.root, 0, []
        for position in range(num_blocks):
            node, i = self._step(node, i, token_ids, position)
            if node is None:
                break
            path.append(node.blocks[i])
            i += 1
        return path

    def insert(self, token_ids: Sequence[int], start: int, blocks: list[list[CachedBlock | None]],
               hint: RadixNode | None = None) -> RadixNode:
        """Add ``blocks[k][g]`` as a copy of block position ``start + k`` of group ``g`` (None: the group holds
        nothing there) on the path of ``token_ids``, creating the path where it is missing.

        ``hint`` is the node this call returned for the same prompt before (the path to ``start`` then ran
        through it), to skip the walk from the root. Returns the node that holds the last position.
        """
        node, i = self._resume(hint, start) if hint is not None and start > 0 else (None, 0)
        first = start
        if node is None:
            node, i, first = self.root, 0, 0
        for position in range(first, start + len(blocks)):
            node, i = self._step_or_grow(node, i, token_ids, position)
            if position >= start:
                for group, block in enumerate(blocks[position - start]):
                    if block is not None:
                        node.blocks[i][group].append(block)
                        block.node, block.position = node, position
            i += 1
        return node

    def remove(self, block: CachedBlock) -> None:
        """Forget one cached copy (the pool reuses the block); prune what is left with no blocks."""
        node = block.node
        group = block.block_hash[0]  # the block's key: (group, chained hash)
        node.blocks[block.position - node.start][group].remove(block)
        block.node = None
        self._prune(node)

    def clear(self) -> None:
        for node in self._nodes():
            node.start = -1
        self.root = RadixNode(None, [], 0, [])

    def num_nodes(self) -> int:
        """Nodes below the root (for tests and debugging)."""
        return sum(1 for _ in self._nodes())

    # -- walking -----------------------------------------------------------------------------------
    def _block(self, token_ids: Sequence[int], position: int) -> list[int]:
        return list(token_ids[position * self.block_size:(position + 1) * self.block_size])

    def _step(self, node: RadixNode, i: int, token_ids: Sequence[int],
              position: int) -> tuple[RadixNode | None, int]:
        """From index ``i`` of ``node`` (the next position to match), the node and index of ``position`` if it
        matches; ``(None, 0)`` where the path ends or the tokens differ."""
        tokens = self._block(token_ids, position)
        if i < len(node.blocks):
            start = i * self.block_size
            return (node, i) if node.tokens[start:start + self.block_size] == tokens else (None, 0)
        child = node.children.get(tuple(tokens))
        return (child, 0) if child is not None else (None, 0)

    def _step_or_grow(self, node: RadixNode, i: int, token_ids: Sequence[int], position: int) -> tuple[RadixNode, int]:
        """As :meth:`_step`, but a missing position is made: the edge is split where the tokens differ, a
        childless edge grows, else a new child starts."""
        found, j = self._step(node, i, token_ids, position)
        if found is not None:
            return found, j
        if i < len(node.blocks):
            node = self._split(node, i)
        tokens = self._block(token_ids, position)
        empty: Copies = [[] for _ in range(self.num_groups)]
        if not node.children and node is not self.root:
            node.tokens.extend(tokens)
            node.blocks.append(empty)
            return node, len(node.blocks) - 1
        child = RadixNode(node, tokens, position, [empty])
        node.children[tuple(tokens)] = child
        return child, 0

    def _resume(self, hint: RadixNode, start: int) -> tuple[RadixNode | None, int]:
        """Where to continue from a remembered node: the node and index just past position ``start - 1``."""
        if hint.start < 0:
            return None, 0
        node = hint
        while node.start > start - 1:  # split since: the position moved to an ancestor
            node = node.parent
        if start - 1 >= node.end:  # pruned since
            return None, 0
        return node, start - node.start

    def _split(self, node: RadixNode, i: int) -> RadixNode:
        """Cut ``node``'s run before its block ``i``; the new upper node takes blocks ``0..i-1`` and is returned."""
        cut = i * self.block_size
        upper = RadixNode(node.parent, node.tokens[:cut], node.start, node.blocks[:i])
        upper.children[tuple(node.tokens[cut:cut + self.block_size])] = node
        node.parent.children[tuple(upper.tokens[:self.block_size])] = upper
        for copies in upper.blocks:
            for group_copies in copies:
                for block in group_copies:
                    block.node = upper
        node.parent, node.tokens, node.blocks, node.start = upper, node.tokens[cut:], node.blocks[i:], node.start + i
        return upper

    def _prune(self, node: RadixNode) -> None:
        """Drop trailing positions without blocks from childless nodes, and nodes left empty, upwards."""
        while node is not self.root and not node.children:
            key = tuple(node.tokens[:self.block_size])
            while node.blocks and not any(node.blocks[-1]):
                node.blocks.pop()
                del node.tokens[-self.block_size:]
            if node.blocks:
                return
            del node.parent.children[key]
            node.start, node = -1, node.parent

    def _nodes(self) -> Iterator[RadixNode]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())
