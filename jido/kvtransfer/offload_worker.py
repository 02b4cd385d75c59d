"""OffloadWorker: the offload connector's worker side — copies released blocks out, and stores, moves and loads entries.

The only work inside a step is copying the blocks released since the last step out of the cache (before the forward
overwrites them). Encoding, writing, moving and loading run on one background thread, in the order the
scheduler side asked (saves, then loads, then moves), so no step waits on a tier, and a load always sees
the saves that came before it.
"""
from __future__ import annotations

import errno
import logging
import queue
import threading
import time
from dataclasses import dataclass

import torch

from jido.config.kv_offload import KVOffloadConfig
from jido.core.kv_connector import BlockKey, KVConnectorOutput
from jido.kvtransfer.base import KVConnectorWorker
from jido.kvtransfer.codecs import KVCodec, make_codec
from jido.kvtransfer.offload_metadata import (FailedEvent, LoadedEvent, LoadRequest, MoveEntry, OffloadMetadata,
                                              SaveBlock, StoredEvent, TierDisabledEvent)
from jido.offload.entry import CorruptEntryError, pack_entry, unpack_entry
from jido.offload.stores import ByteStore, StoreError, make_store

logger = logging.getLogger("jido")
IDLE_WAIT_S = 0.05  # with nothing to compute, how long get_finished waits for a load to end


@dataclass(frozen=True)
class _Save:
    save: SaveBlock
    block: torch.Tensor  # [layers, 2, block_size, kv_heads, width], a copy on the CPU


class OffloadWorker(KVConnectorWorker):
    """Moves blocks between this worker's cache tensors and the tiers' byte stores."""

    def __init__(self, config: KVOffloadConfig, fingerprint: str, num_layers: int, cache_dtype: torch.dtype,
                 stores: dict[str, ByteStore] | None = None) -> None:
        self.fingerprint = bytes.fromhex(fingerprint)
        self.num_layers = num_layers
        self.cache_dtype = cache_dtype
        self.tier_codecs = {t.name: make_codec(t.codec, num_layers, cache_dtype) for t in config.tiers}
        self.stores = stores if stores is not None else {t.name: make_store(t, fingerprint) for t in config.tiers}
        self._codecs: dict[str, KVCodec] = {c.name: c for c in self.tier_codecs.values()}
        self._disabled: set[str] = set()
        self._meta: OffloadMetadata | None = None
        self._jobs: queue.Queue = queue.Queue()
        self._done = threading.Condition()
        self._events: list = []
        self._finished: dict[str, bool] = {}
        self._num_loading = 0
        self._thread = threading.Thread(target=self._run, name="jido-kv-offload", daemon=True)
        self._thread.start()

    # -- the step ----------------------------------------------------------------------------------
    def bind_connector_metadata(self, metadata: OffloadMetadata | None) -> None:
        self._meta = metadata

    def start_load_kv(self) -> None:
        meta, self._meta = self._meta, None
        if meta is None:
            return
        for save in meta.saves:  # NOTE: before the forward, which may write these very blocks
            self._jobs.put(_Save(save, self._read_block(save.block_id, save.key)))
        with self._done:
            self._num_loading += len(meta.loads)
        for job in (*meta.loads, *meta.moves):
            self._jobs.put(job)

    def get_finished(self, idle: bool) -> KVConnectorOutput:
        with self._done:
            if idle and self._num_loading and not self._finished:
                self._done.wait(IDLE_WAIT_S)
            output = KVConnectorOutput(finished_loading=self._finished, events=self._events)
            self._finished, self._events = {}, []
        return output

    def flush(self) -> None:
        """Block until every job handed to the background thread so far is done (writes landed)."""
        self._jobs.join()

    def shutdown(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=5.0)
        for store in self.stores.values():
            store.close()

    # -- blocks in the cache -----------------------------------------------------------------------
    def _layers(self, key: BlockKey) -> tuple[int, ...]:
        return self.blocks.layers(key[0])

    def _read_block(self, block_id: int, key: BlockKey) -> torch.Tensor:
        return self.blocks.read(key[0], block_id)

    def _write_block(self, block_id: int, key: BlockKey, block: torch.Tensor) -> None:
        self.blocks.write(key[0], block_id, block)

    def _block_shape(self, key: BlockKey) -> tuple[int, ...]:
        return self.blocks.shape(key[0])

    # -- the background thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._do(job)
            self._jobs.task_done()

    def _do(self, job: _Save | LoadRequest | MoveEntry) -> None:
        finished = None
        if isinstance(job, _Save):
            events = self._save(job)
        elif isinstance(job, LoadRequest):
            events, finished = self._load(job)
        else:
            events = self._move(job)
        with self._done:
            self._events.extend(events)
            if finished is not None:
                self._finished[job.req_id] = finished
                self._num_loading -= 1
                self._done.notify_all()

    def _encode(self, tier: str, key: BlockKey, block: torch.Tensor) -> bytes:
        codec = self.tier_codecs[tier]
        return pack_entry(self.fingerprint, codec.name, codec.encode(block, self._layers(key)))

    def _put(self, tier: str, key: BlockKey, data: bytes) -> list:
        if tier in self._disabled:
            return [FailedEvent(tier, key, "store", "the tier is disabled")]
        try:
            self.stores[tier].put(key, data)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self._disabled.add(tier)
                return [FailedEvent(tier, key, "store", str(exc)), TierDisabledEvent(tier, f"disk full: {exc}")]
            return [FailedEvent(tier, key, "store", str(exc))]
        except StoreError as exc:
            return [FailedEvent(tier, key, "store", str(exc))]
        return [StoredEvent(tier, key, len(data))]

    def _save(self, job: _Save) -> list:
        events, encoded = [], {}
        for tier in job.save.tiers:
            codec = self.tier_codecs[tier].name
            if codec not in encoded:
                encoded[codec] = self._encode(tier, job.save.key, job.block)
            events += self._put(tier, job.save.key, encoded[codec])
        return events

    def _fetch(self, tier: str, key: BlockKey) -> torch.Tensor:
        """Read, check and decode one entry (raises KeyError, CorruptEntryError, OSError or StoreError)."""
        data = self.stores[tier].get(key)
        if data is None:
            raise KeyError("the entry is gone (evicted since the lookup)")
        codec_name, payload = unpack_entry(data, self.fingerprint)
        codec = self._codec(codec_name)
        try:
            return codec.decode(payload, self._block_shape(key), self.cache_dtype, self._layers(key))
        except (ValueError, RuntimeError) as exc:  # a payload that does not decode to the block's shape
            raise CorruptEntryError(f"{codec_name} payload does not decode: {exc}") from None

    def _codec(self, name: str) -> KVCodec:
        if name not in self._codecs:
            try:
                self._codecs[name] = make_codec(name, self.num_layers, self.cache_dtype)
            except ValueError as exc:
                raise CorruptEntryError(str(exc)) from None
        return self._codecs[name]

    def _load(self, job: LoadRequest) -> tuple[list, bool]:
        events = []
        for block in job.blocks:
            start = time.perf_counter()
            try:
                data = self._fetch(block.tier, block.key)
                self._write_block(block.block_id, block.key, data)
            except CorruptEntryError as exc:
                self._drop(block.tier, block.key)
                return [*events, FailedEvent(block.tier, block.key, "corrupt", str(exc))], False
            except (KeyError, OSError, StoreError) as exc:
                return [*events, FailedEvent(block.tier, block.key, "load", str(exc))], False
            events.append(LoadedEvent(block.tier, block.key, data.numel() * data.element_size(), time.perf_counter() - start))
        return events, True

    def _drop(self, tier: str, key: BlockKey) -> None:
        try:
            self.stores[tier].delete(key)
        except (OSError, StoreError) as exc:
            logger.warning("KV offload tier %s: could not delete a corrupt entry: %s", tier, exc)

    def _move(self, move: MoveEntry) -> list:
        try:
            data = self.stores[move.src].get(move.key)
            self.stores[move.src].delete(move.key)
        except (OSError, StoreError) as exc:
            return [FailedEvent(move.src, move.key, "move", str(exc))]
        if move.dst is None or data is None:
            return []
        if self.tier_codecs[move.dst].name != self.tier_codecs[move.src].name:
            try:
                data = self._encode(move.dst, move.key, self._decoded(data, move.key))
            except CorruptEntryError as exc:
                return [FailedEvent(move.src, move.key, "corrupt", str(exc))]
        return self._put(move.dst, move.key, data)

    def _decoded(self, data: bytes, key: BlockKey) -> torch.Tensor:
        codec_name, payload = unpack_entry(data, self.fingerprint)
        return self._codec(codec_name).decode(payload, self._block_shape(key), self.cache_dtype, self._layers(key))
