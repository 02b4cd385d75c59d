"""Replica routing for data parallelism: prefix-hash affinity with load balance (cache-aware), or round robin.

Pure Python, so an in-process data-parallel engine and an HTTP router in front of separate servers can share
the policy: it sees token ids and replica loads, and returns a replica index.
"""
from __future__ import annotations

import itertools
from collections import OrderedDict
from typing import Protocol

from jido.utils.hashing import BlockHash, hash_block_tokens


class ReplicaRouter(Protocol):
    """Picks the replica for a request.

    ``route(token_ids, loads)``: ``loads[i]`` is replica ``i``'s unfinished sequences; returns an index into
    ``loads``. A router may remember what it sent where (its picture of each replica's prefix cache).
    """

    def route(self, token_ids: list[int], loads: list[int]) -> int: ...


class RoundRobinRouter:
    """Replicas in turn, whatever the prompt."""

    def __init__(self, num_replicas: int) -> None:
        self._next = itertools.cycle(range(num_replicas))

    def route(self, token_ids: list[int], loads: list[int]) -> int:
        return next(self._next)


class CacheAwareRouter:
    """The replica whose prefix cache most likely holds the longest prefix of the prompt, unless loads are uneven.

    Each replica's cache is approximated by the chained hashes of the full blocks of the prompts sent to it
    (an LRU of ``capacity_blocks``, about the replica's KV blocks): the same hashes its block pool keys on, so
    a match of ``n`` blocks predicts an ``n``-block prefix hit. As SGLang's router does, balance wins when the
    busiest replica has more than ``balance_abs`` sequences over the idlest and more than ``balance_rel``
    times as many; then, and when no replica matches a block, the least loaded replica takes the request.
    """

    def __init__(self, num_replicas: int, block_size: int, capacity_blocks: int, balance_abs: int = 8,
                 balance_rel: float = 1.5) -> None:
        self.block_size = block_size
        self.capacity_blocks = capacity_blocks
        self.balance_abs, self.balance_rel = balance_abs, balance_rel
        self._seen: list[OrderedDict[BlockHash, None]] = [OrderedDict() for _ in range(num_replicas)]

    def route(self, token_ids: list[int], loads: list[int]) -> int:
        hashes = self._block_hashes(token_ids)
        least_loaded = min(range(len(loads)), key=lambda r: (loads[r], r))
        if max(loads) - min(loads) > self.balance_abs and max(loads) > self.balance_rel * min(loads):
            choice = least_loaded
        else:
            matched = [self._matched_blocks(seen, hashes) for seen in self._seen]
            best = max(range(len(loads)), key=lambda r: (matched[r], -loads[r], -r))
            choice = best if matched[best] else least_loaded
        self._remember(self._seen[choice], hashes)
        return choice

    def _block_hashes(self, token_ids: list[int]) -> list[BlockHash]:
        hashes: list[BlockHash] = []
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            hashes.append(hash_block_tokens(hashes[-1] if hashes else None, token_ids[start:start + self.block_size]))
        return hashes

    @staticmethod
    def _matched_blocks(seen: OrderedDict[BlockHash, None], hashes: list[BlockHash]) -> int:
        """Leading blocks of the prompt this replica was sent before (a chained hash names its whole prefix)."""
        return next((i for i, h in enumerate(hashes) if h not in seen), len(hashes))

    def _remember(self, seen: OrderedDict[BlockHash, None], hashes: list[BlockHash]) -> None:
        for block_hash in hashes:
            seen[block_hash] = None
            seen.move_to_end(block_hash)
        while len(seen) > self.capacity_blocks:
            seen.popitem(last=False)


def make_router(policy: str, num_replicas: int, block_size: int, capacity_blocks: int) -> ReplicaRouter:
    """The router of ``data_parallel_routing``: ``cache_aware`` or ``round_robin``."""
    if policy == "round_robin":
        return RoundRobinRouter(num_replicas)
    if policy == "cache_aware":
        return CacheAwareRouter(num_replicas, block_size, capacity_blocks)
    raise ValueError(f"unknown data_parallel_routing {policy!r}; available: cache_aware, round_robin")
