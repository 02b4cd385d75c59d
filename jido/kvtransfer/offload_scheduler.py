"""OffloadScheduler: the offload connector's scheduler side — which tier holds what, what to save, load and move.

Tiers (CPU memory, disk, Redis) sit below the device pool. A cached block is saved to the first local tier
(and written through to the remote tier, which other servers read) when its last holder lets go, before
the pool can evict it, so the tiers hold everything the pool may drop; a local tier over its budget moves
its least recently used entries down to the next local tier, or drops them. A waiting
request whose prefix continues past the device's hit in the tiers waits while its blocks are loaded.

Per layer group, a tier stores what the device pool holds: one entry per ``(group, block hash)``, the
group's layers for that block's tokens. A hit of ``m`` blocks loads blocks ``n0..m-1`` of every full
attention group, and of each sliding-window group only those the query at ``m * block_size`` can see
(the last ``window - 1`` keys), as the device prefix cache does.

The local tiers' index (keys, sizes, LRU order) lives here, the bytes in the workers; a disk tier's files
outlive the process and are indexed again at start. Redis is its own index, asked in one round trip per
lookup. A remote tier that fails is left alone for a few seconds.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from jido.config.kv_offload import KVOffloadConfig, TierConfig
from jido.core.kv_cache_manager import positions_to_load
from jido.core.kv_cache_spec import KVCacheConfig, SlidingWindowSpec
from jido.core.kv_connector import BlockKey, ReleasedBlock, KVConnectorOutput, KVConnectorScheduler
from jido.core.outputs import SchedulerOutput
from jido.core.request import Request
from jido.kvtransfer.offload_metadata import (FailedEvent, LoadBlock, LoadedEvent, LoadRequest, MoveEntry,
                                              OffloadMetadata, SaveBlock, StoredEvent, TierDisabledEvent)
from jido.metrics.stats import KVTierStats
from jido.offload.stores import ByteStore, StoreError, WarnEvery, disk_entries, make_store

logger = logging.getLogger("jido")
REMOTE_RETRY_S = 5.0  # after a failed remote lookup, skip the remote tier this long
LOOKUP_TTL_S = 1.0  # how long one request's lookup is reused while it waits for room
_REMOTE_WRITTEN_MAX = 1 << 16  # keys remembered as written through, so a reloaded block is not sent again


class TierIndex:
    """One local tier's entries in LRU order (the head goes first) and the bytes they hold."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self.entries: OrderedDict[BlockKey, int] = OrderedDict()
        self.used = 0

    def __contains__(self, key: BlockKey) -> bool:
        return key in self.entries

    def touch(self, key: BlockKey) -> None:
        self.entries.move_to_end(key)

    def put(self, key: BlockKey, num_bytes: int) -> list[tuple[BlockKey, int]]:
        """Add or resize an entry; returns the LRU entries pushed out to stay within the budget."""
        self.used += num_bytes - self.entries.get(key, 0)
        self.entries[key] = num_bytes
        self.entries.move_to_end(key)
        victims = []
        while self.used > self.capacity and len(self.entries) > 1:
            victim, size = self.entries.popitem(last=False)
            self.used -= size
            victims.append((victim, size))
        return victims

    def remove(self, key: BlockKey) -> None:
        self.used -= self.entries.pop(key, 0)


@dataclass
class _Counters:
    hits: int = 0
    misses: int = 0
    stored_blocks: int = 0
    stored_bytes: int = 0
    loaded_blocks: int = 0
    loaded_bytes: int = 0
    load_seconds: float = 0.0
    errors: int = 0
    enabled: bool = True


class OffloadScheduler(KVConnectorScheduler):
    """Decides what the tiers keep and what comes back; the workers (``OffloadWorker``) move the bytes."""

    def __init__(self, config: KVOffloadConfig, kv_cache_config: KVCacheConfig, fingerprint: str,
                 remote: ByteStore | None = None) -> None:
        self.block_size = kv_cache_config.block_size
        self.windows = [g.spec.sliding_window if isinstance(g.spec, SlidingWindowSpec) else None
                        for g in kv_cache_config.groups]
        # Until a worker reports the real size: the raw bytes (codecs only make entries smaller).
        self.entry_bytes = [len(g.layer_ids) * kv_cache_config.page_size_bytes for g in kv_cache_config.groups]
        self.order = [t.name for t in config.tiers]
        self.local = {t.name: TierIndex(t.name, t.size_bytes or 0) for t in config.tiers if t.name != "remote"}
        remote_tier = next((t for t in config.tiers if t.name == "remote"), None)
        self.remote = remote if remote is not None or remote_tier is None else make_store(remote_tier, fingerprint)
        self._remote_down_until = 0.0
        self._remote_written: OrderedDict[BlockKey, None] = OrderedDict()
        self.counters = {name: _Counters() for name in self.order}
        self._plans: dict[str, tuple[int, int, dict[tuple[int, int], str]]] = {}
        # A request the pool cannot admit yet is asked about every step: its lookup is kept for LOOKUP_TTL_S (a
        # stale one only costs a failed load or a shorter hit) rather than asking Redis again each time.
        self._lookups: dict[str, tuple[float, int, int, dict[tuple[int, int], str]]] = {}
        self._counted: set[str] = set()
        self._meta = OffloadMetadata()
        self._warn = WarnEvery(logger)
        for tier in config.tiers:
            if tier.name == "disk":
                self._adopt_disk_entries(tier, fingerprint)

    def _adopt_disk_entries(self, tier: TierConfig, fingerprint: str) -> None:
        """Index what the disk tier kept from earlier runs, oldest first: the newest that fit the budget stay (the
        first step's moves delete the rest). Entries carry the fingerprint and a checksum, so a stale or damaged
        one is caught when it is read, as any corrupt entry."""
        entries = disk_entries(tier, fingerprint)
        for key, num_bytes in entries:
            self._place("disk", key, num_bytes)
        if entries:
            index = self.local["disk"]
            logger.info("KV offload tier disk: %d entries of earlier runs kept (%d bytes)", len(index.entries), index.used)

    # -- lookups -----------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        n0 = num_computed_tokens // self.block_size
        limit = (request.num_tokens - 1) // self.block_size
        if limit <= n0:
            return 0
        now = time.monotonic()
        cached = self._lookups.get(request.request_id)
        if cached is not None and cached[1:3] == (n0, limit) and now - cached[0] < LOOKUP_TTL_S:
            where = cached[3]
        else:
            where = self._locate(request.block_hashes, n0, limit)
            self._lookups[request.request_id] = (now, n0, limit, where)
        if request.request_id not in self._counted:
            self._counted.add(request.request_id)
            self._count_lookup(request.block_hashes, where, n0, limit)
        num_hit = self._longest_loadable(where, n0, limit)
        if num_hit == n0:
            return 0
        self._plans[request.request_id] = (n0, num_hit, where)
        return (num_hit - n0) * self.block_size

    def _locate(self, hashes: list[bytes], start: int, end: int) -> dict[tuple[int, int], str]:
        """For each (group, position) in ``start..end-1`` held by some tier, the first tier that holds it."""
        where, missing = {}, []
        for i in range(start, end):
            for group in range(len(self.windows)):
                key = (group, hashes[i])
                tier = next((t for t, index in self.local.items() if key in index), None)
                if tier is not None:
                    where[(group, i)] = tier
                else:
                    missing.append((group, i))
        for (group, i), found in zip(missing, self._remote_contains([(g, hashes[i]) for g, i in missing])):
            if found:
                where[(group, i)] = "remote"
        return where

    def _remote_contains(self, keys: list[BlockKey]) -> list[bool]:
        if self.remote is None or not keys or time.monotonic() < self._remote_down_until:
            return [False] * len(keys)
        try:
            return self.remote.contains(keys)
        except StoreError as exc:
            self._remote_down_until = time.monotonic() + REMOTE_RETRY_S
            self.counters["remote"].errors += 1
            self._warn("remote", f"lookup failed ({exc}); not asking it again for {REMOTE_RETRY_S:.0f} s")
            return [False] * len(keys)

    def _longest_loadable(self, where: dict[tuple[int, int], str], n0: int, limit: int) -> int:
        """The most blocks ``m`` whose full groups hold ``n0..m-1`` and whose sliding groups hold their window."""
        full = [g for g, w in enumerate(self.windows) if w is None]
        end = n0
        while end < limit and all((g, end) in where for g in full):
            end += 1
        for num_hit in range(end, n0, -1):
            if all((g, i) in where for g in range(len(self.windows)) for i in self._needed(g, n0, num_hit)):
                return num_hit
        return n0

    def _needed(self, group: int, n0: int, num_hit: int) -> range:
        """The positions of ``group`` a hit of ``num_hit`` blocks loads (the device already has ``0..n0-1``)."""
        return positions_to_load(self.windows[group], self.block_size, n0 * self.block_size,
                                 num_hit * self.block_size)

    def _count_lookup(self, hashes: list[bytes], where: dict[tuple[int, int], str], n0: int, limit: int) -> None:
        """Per tier, blocks of the prefix found there and blocks asked for and not there (group 0's chain)."""
        for i in range(n0, limit):
            tier = where.get((0, i))
            for name in self.order:
                if name == tier:
                    break
                self.counters[name].misses += 1
            if tier is None:
                return
            self.counters[tier].hits += 1

    def update_state_after_alloc(self, request: Request, block_ids: list[list[int]], num_computed_tokens: int,
                                 num_external_tokens: int) -> None:
        n0, num_hit, where = self._plans.pop(request.request_id)
        self._lookups.pop(request.request_id, None)
        blocks = []
        for group in range(len(self.windows)):
            for i in self._needed(group, n0, num_hit):
                key, tier = (group, request.block_hashes[i]), where[(group, i)]
                if tier in self.local:
                    self.local[tier].touch(key)
                blocks.append(LoadBlock(block_ids[group][i], key, tier))
        self._meta.loads.append(LoadRequest(request.request_id, tuple(blocks)))

    # -- saves -------------------------------------------------------------------------------------
    def on_blocks_released(self, blocks: list[ReleasedBlock]) -> None:
        for block in blocks:
            holder = next((index for index in self.local.values() if block.key in index), None)
            if holder is not None:
                holder.touch(block.key)  # kept already: saving it again would only cost bandwidth
                continue
            tiers = []
            first = next(iter(self.local), None)
            if first is not None:
                tiers.append(first)
                self._place(first, block.key, self.entry_bytes[block.key[0]])
            if self.remote is not None and block.key not in self._remote_written:
                tiers.append("remote")
                self._remember_written(block.key)
            if tiers:
                self._meta.saves.append(SaveBlock(block.block_id, block.key, tuple(tiers)))

    def _place(self, tier: str, key: BlockKey, num_bytes: int) -> None:
        """Account an entry in a local tier, moving what its budget pushes out one tier down."""
        for victim, size in self.local[tier].put(key, num_bytes):
            lower = self._next_local(tier)
            self._meta.moves.append(MoveEntry(victim, tier, lower))
            if lower is not None:
                self._place(lower, victim, size)

    def _next_local(self, tier: str) -> str | None:
        names = list(self.local)
        return names[names.index(tier) + 1] if names.index(tier) + 1 < len(names) else None

    def _remember_written(self, key: BlockKey) -> None:
        self._remote_written[key] = None
        if len(self._remote_written) > _REMOTE_WRITTEN_MAX:
            self._remote_written.popitem(last=False)

    def build_connector_meta(self, scheduler_output: SchedulerOutput,
                             block_ids: Callable[[str], list[list[int]]]) -> OffloadMetadata | None:
        meta, self._meta = self._meta, OffloadMetadata()
        return None if meta.is_empty else meta

    def has_pending_work(self) -> bool:
        return not self._meta.is_empty

    # -- reports -----------------------------------------------------------------------------------
    def update_connector_output(self, output: KVConnectorOutput) -> None:
        for event in output.events:
            counters = self.counters.get(event.tier)
            if counters is None:
                continue
            if isinstance(event, StoredEvent):
                counters.stored_blocks += 1
                counters.stored_bytes += event.num_bytes
                if event.tier in self.local and event.key in self.local[event.tier]:
                    self._place(event.tier, event.key, event.num_bytes)
            elif isinstance(event, LoadedEvent):
                counters.loaded_blocks += 1
                counters.loaded_bytes += event.num_bytes
                counters.load_seconds += event.seconds
                if event.tier == "remote":
                    self._remember_written(event.key)  # Redis has it: not written back when the block is released
            elif isinstance(event, FailedEvent):
                self._forget(event.tier, event.key)
                counters.errors += 1
                self._warn(event.tier, f"{event.op} failed: {event.reason}")
            elif isinstance(event, TierDisabledEvent):
                self.local.pop(event.tier, None)
                counters.enabled = False
                logger.warning("KV offload tier %s disabled: %s", event.tier, event.reason)

    def _forget(self, tier: str, key: BlockKey) -> None:
        if tier in self.local:
            self.local[tier].remove(key)
        elif tier == "remote":
            self._remote_written.pop(key, None)

    def request_finished(self, request: Request, block_ids: list[list[int]]) -> tuple[bool, None]:
        self._plans.pop(request.request_id, None)
        self._lookups.pop(request.request_id, None)
        self._counted.discard(request.request_id)
        return False, None

    def stats(self) -> tuple[KVTierStats, ...]:
        return tuple(KVTierStats(name, c.hits, c.misses, c.stored_blocks, c.stored_bytes, c.loaded_blocks,
                                 c.loaded_bytes, c.load_seconds, c.errors,
                                 self.local[name].used if name in self.local else 0, c.enabled)
                     for name, c in self.counters.items())
