"""Replica routing for data parallelism: prefix-hash affinity with load balance (cache-aware), or round robin.

The policy sees token ids and replica loads and returns a replica index; its memory of which replica holds
which prefix is :class:`jido.utils.prefix_affinity.PrefixAffinity`, the one the HTTP router keeps too.
"""
from __future__ import annotations

import itertools
from typing import Protocol

from jido.utils.hashing import BlockHash, hash_block_tokens
from jido.utils.prefix_affinity import PrefixAffinity


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
    (a :class:`PrefixAffinity` of ``capacity_blocks`` per replica, about the replica's KV blocks): the same
    hashes its block pool keys on, so a match of ``n`` blocks predicts an ``n``-block prefix hit. As SGLang's
    router does, balance wins when the busiest replica has more than ``balance_abs`` sequences over the idlest
    and more than ``balance_rel`` times as many; then, and when no replica matches a block, the least loaded
    replica takes the request. Among replicas matching as many blocks, the least loaded (then lowest index) wins.
    """

    def __init__(self, block_size: int, capacity_blocks: int, balance_abs: int = 8,
                 balance_rel: float = 1.5) -> None:
        self.block_size = block_size
        self.balance_abs, self.balance_rel = balance_abs, balance_rel
        self.affinity: PrefixAffinity[int] = PrefixAffinity(capacity_blocks)

    def route(self, token_ids: list[int], loads: list[int]) -> int:
        hashes = self._block_hashes(token_ids)
        by_load = sorted(range(len(loads)), key=lambda r: (loads[r], r))
        balanced = not (max(loads) - min(loads) > self.balance_abs and max(loads) > self.balance_rel * min(loads))
        holder = self.affinity.longest_match(hashes, by_load)[0] if balanced else None
        choice = by_load[0] if holder is None else holder
        self.affinity.record(hashes, choice)
        return choice

    def _block_hashes(self, token_ids: list[int]) -> list[BlockHash]:
        hashes: list[BlockHash] = []
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            hashes.append(hash_block_tokens(hashes[-1] if hashes else None, token_ids[start:start + self.block_size]))
        return hashes


def make_router(policy: str, num_replicas: int, block_size: int, capacity_blocks: int) -> ReplicaRouter:
    """The router of ``data_parallel_routing``: ``cache_aware`` or ``round_robin``."""
    if policy == "round_robin":
        return RoundRobinRouter(num_replicas)
    if policy == "cache_aware":
        return CacheAwareRouter(block_size, capacity_blocks)
    raise ValueError(f"unknown data_parallel_routing {policy!r}; available: cache_aware, round_robin")
