"""DisaggWorker: the disaggregation connector's worker side — serves held KV to consumers, pushes it, loads it.

Three threads besides the step's: the KV endpoint (answers peers: hello, pull, release, push; checks the
leases), the sender (a producer's pushes, in order) and the loader (a consumer's loads, one after another).
In the step itself a producer only copies the blocks it pushes out of the cache (each layer right after
the forward wrote it, when layer-wise) and registers its exports once the forward is done; a consumer
only hands its loads to the loader. No step waits on a peer.

Ownership (see :mod:`jido.kvtransfer.handoff`): a producer's export holds the request's blocks until the
consumer releases it (pull), acknowledges the last push (push), or the lease runs out; a consumer's load
fails (the request prefills itself) when the producer does not answer within ``kv_transfer_timeout_s``.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from jido.attention.kv_quant import row_width
from jido.config.kv_transfer import KVTransferConfig
from jido.core.kv_cache_spec import KVCacheConfig, SlidingWindowSpec
from jido.core.kv_connector import KVConnectorOutput
from jido.kvtransfer.base import KVConnectorWorker
from jido.kvtransfer.block_io import convert_rows
from jido.kvtransfer.codecs import KVCodec, make_codec
from jido.kvtransfer.disagg_metadata import DisaggMetadata, ExportKV, LoadKV, Piece, PushKV, TransferEvent
from jido.kvtransfer.endpoint import PARK, KVClient, KVServer, Reply
from jido.kvtransfer.handoff import Handoff, HandoffState, KVFormat, KVFormatError, KVHandle
from jido.kvtransfer.push_buffer import PushBuffer, Pushed
from jido.kvtransfer.transport import TransferError, make_channel

logger = logging.getLogger("jido")
IDLE_WAIT_S = 0.05  # with nothing to compute, how long get_finished waits for a transfer to end
RELEASE_TIMEOUT_S = 1.0
UNREACHABLE_S = 2.0  # after a peer failed to answer, fail its next transfers at once for this long
PUSH_GRACE_S = 0.25  # a handle pushed here: how long its first piece may lag behind it before we pull


@dataclass
class _Export:
    """KV a producer holds for a consumer: where each piece sits, and the hand-off's state and lease."""

    req_id: str
    pieces: dict[tuple[int, int], int]  # (group, position) -> block id
    handoff: Handoff
    step: int  # the step that registered it; its end is reported no earlier than the next step
    num_sent_bytes: int = 0
    started: float = 0.0


@dataclass(frozen=True)
class _Outgoing:
    """One push message: these pieces' rows (``layers`` of each) copied out of the cache this step."""

    push: PushKV
    pieces: tuple[Piece, ...]
    layers: tuple[tuple[int, ...], ...]
    blocks: tuple[torch.Tensor, ...]
    final: bool


class DisaggWorker(KVConnectorWorker):
    """Moves KV between this worker's cache and other instances' through the configured transport."""

    def __init__(self, config: KVTransferConfig, model_fingerprint: str, num_layers: int,
                 cache_dtype: torch.dtype) -> None:
        self.config = config
        self.model_fingerprint = model_fingerprint
        self.num_layers = num_layers
        self.cache_dtype = cache_dtype
        self.codec = make_codec(config.kv_codec, num_layers, cache_dtype)  # NOTE: refuses int8 over a quantized cache
        self._codecs: dict[str, KVCodec] = {self.codec.name: self.codec}
        self.channel = make_channel(config.kv_connector)
        self._lock = threading.Condition()
        self._exports: dict[str, _Export] = {}
        self._closed: OrderedDict[str, str] = OrderedDict()  # handle id -> how it ended, for late pulls
        self._buffer = PushBuffer(config.buffer_bytes, config.kv_lease_s)
        self._finished_loading: dict[str, bool] = {}
        self._finished_saving: dict[str, int] = {}  # req id -> step its export was registered in
        self._events: list[TransferEvent] = []
        self._num_loading = 0
        self._step = 0
        self._meta: DisaggMetadata | None = None
        self._step_pushes: list[PushKV] = []
        self._step_exports: list[ExportKV] = []
        self._push_failed: set[str] = set()
        self._sends: queue.Queue = queue.Queue()
        self._loads: queue.Queue = queue.Queue()
        self._threads: list[threading.Thread] = []
        self.server = KVServer(config.kv_ip, config.kv_port, self._handle, self._on_poll)

    def register_kv_caches(self, kv_caches: list[torch.Tensor], kv_cache_config: KVCacheConfig,
                           block_token_dim: int) -> None:
        super().register_kv_caches(kv_caches, kv_cache_config, block_token_dim)
        _, _, block_size, num_kv_heads, _ = self.blocks.shape(0)
        self.head_dim = kv_cache_config.groups[0].spec.head_dim
        self.format = KVFormat(
            self.model_fingerprint, block_size, tuple(g.layer_ids for g in kv_cache_config.groups),
            tuple(g.spec.sliding_window if isinstance(g.spec, SlidingWindowSpec) else None
                  for g in kv_cache_config.groups),
            num_kv_heads, self.head_dim, str(self.cache_dtype).removeprefix("torch."), self.codec.name)
        for target, name in ((self._send_loop, "jido-kv-sender"), (self._load_loop, "jido-kv-loader")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def info(self) -> dict[str, Any]:
        """What the engine and the router learn about this endpoint: its address, role, mode and KV format."""
        return {"address": self.server.address, "kv_role": self.config.kv_role, "kv_connector": self.config.kv_connector,
                "kv_mode": self.config.kv_mode, "kv_layerwise": self.config.kv_layerwise, "format": self.format.to_dict()}

    # -- the step ----------------------------------------------------------------------------------
    def bind_connector_metadata(self, metadata: DisaggMetadata | None) -> None:
        self._meta = metadata

    def start_load_kv(self) -> None:
        self._step += 1
        meta, self._meta = self._meta, None
        self._step_pushes = []
        if meta is None:
            return
        for handle_id in meta.drops:
            self._close_export(handle_id, "dropped", report=False)
        with self._lock:
            self._num_loading += len(meta.loads)
        for item in (*meta.loads, *meta.releases):
            self._loads.put(item)
        self._step_pushes = [p for p in meta.pushes if p.handle_id not in self._push_failed]
        self._step_exports = meta.exports

    def save_kv_layer(self, layer_id: int, kv_cache: torch.Tensor, attn_metadata: Any) -> None:
        if not self.config.kv_layerwise:
            return
        for push in self._step_pushes:
            pieces = tuple(p for p in push.pieces if layer_id in self.blocks.layers(p.group))
            if pieces:
                blocks = tuple(self.blocks.read(p.group, p.block_id, (layer_id,)) for p in pieces)
                self._sends.put(_Outgoing(push, pieces, ((layer_id,),) * len(pieces), blocks, False))

    def wait_for_save(self) -> None:
        """After the forward: whole-request pushes leave now, exports open, and each pushed prompt's end is sent."""
        pushes, self._step_pushes = self._step_pushes, []
        exports, self._step_exports = self._step_exports, []
        for export in exports:
            self._open_export(export)
        for push in pushes:
            if not self.config.kv_layerwise and push.pieces:
                blocks = tuple(self.blocks.read(p.group, p.block_id) for p in push.pieces)
                layers = tuple(self.blocks.layers(p.group) for p in push.pieces)
                self._sends.put(_Outgoing(push, push.pieces, layers, blocks, push.final))
            elif push.final:
                self._sends.put(_Outgoing(push, (), (), (), True))

    def get_finished(self, idle: bool) -> KVConnectorOutput:
        with self._lock:
            if idle and (self._num_loading or self._exports) and not (self._finished_loading or self._events):
                self._lock.wait(IDLE_WAIT_S)
            saving = {r for r, step in self._finished_saving.items() if step < self._step}
            for req_id in saving:
                del self._finished_saving[req_id]
            output = KVConnectorOutput(finished_loading=self._finished_loading, finished_saving=saving,
                                       events=list(self._events))
            self._finished_loading, self._events = {}, []
        return output

    def shutdown(self) -> None:
        self._sends.put(None)
        self._loads.put(None)
        for thread in self._threads:
            thread.join(timeout=5.0)
        self.server.close()
        self.channel.close()

    # -- producer: exports -------------------------------------------------------------------------
    def _open_export(self, export: ExportKV) -> None:
        pieces = {(p.group, p.position): p.block_id for p in export.pieces}
        handoff = Handoff(export.handle_id, HandoffState.RESERVED, time.monotonic() + export.lease_s)
        with self._lock:
            self._exports[export.handle_id] = _Export(export.req_id, pieces, handoff, self._step)
            self._lock.notify_all()

    def _close_export(self, handle_id: str, how: str, report: bool = True) -> _Export | None:
        """End an export (released, pushed, expired, dropped); its request's blocks are then freed."""
        with self._lock:
            export = self._exports.pop(handle_id, None)
            self._closed[handle_id] = how
            while len(self._closed) > 4096:
                self._closed.popitem(last=False)
            if export is not None:
                self._finished_saving[export.req_id] = export.step
                if report and how == "expired":
                    self._events.append(TransferEvent("sent", handle_id, "lease", "expired",
                                                      reason="no consumer released it within its lease"))
                self._lock.notify_all()
        return export

    def _on_poll(self) -> None:
        """On the endpoint's thread between messages: leases and unclaimed payloads run out."""
        now = time.monotonic()
        with self._lock:
            expired = [h for h, e in self._exports.items() if e.handoff.expired(now)]
        for handle_id in expired:
            logger.warning("KV hand-off %s: no consumer released it within %g s; freeing its blocks", handle_id,
                           self.config.kv_lease_s)
            self._close_export(handle_id, "expired")
        for handle_id in self._buffer.expire():
            logger.warning("KV pushed for hand-off %s was never claimed within %g s; dropped", handle_id,
                           self.config.kv_lease_s)
        self.channel.expire(self.config.kv_transfer_timeout_s)

    # -- the endpoint ------------------------------------------------------------------------------
    def _handle(self, header: dict[str, Any], payloads: list[memoryview]) -> Reply | object:
        op = header.get("op")
        if op == "hello":
            return {"ok": True, "format": self.format.to_dict()}, []
        if op == "pull":
            return self._serve_pull(header)
        if op == "release":
            export = self._close_export(str(header.get("handle")), "released")
            return {"ok": export is not None}, []
        if op == "push":
            refused = self._buffer.put(str(header.get("handle")), header, self.channel.unpack(header, payloads))
            return ({"ok": True}, []) if refused is None else ({"ok": False, "error": refused}, [])
        return {"ok": False, "error": f"unknown KV operation {op!r}"}, []

    def _serve_pull(self, header: dict[str, Any]) -> Reply | object:
        handle_id = str(header.get("handle"))
        with self._lock:
            export = self._exports.get(handle_id)
            if export is None:
                how = self._closed.get(handle_id)
                if how is not None:
                    return {"ok": False, "error": f"KV handle {handle_id} was already freed here ({how})"}, []
                first = header.setdefault("_parked_at", time.monotonic())
                if time.monotonic() - first < self.config.kv_transfer_timeout_s:
                    return PARK  # its prefill's step has not registered it yet
                return {"ok": False, "error": f"unknown KV handle {handle_id}"}, []
            try:
                wanted = [(int(g), int(p)) for g, p in header["pieces"]]
                blocks = [self.blocks.read(g, export.pieces[(g, p)]) for g, p in wanted]
            except (KeyError, TypeError, ValueError) as exc:
                return {"ok": False, "error": f"pull of pieces this hand-off does not hold: {exc!r}"}, []
            if export.handoff.state == HandoffState.RESERVED:
                export.handoff.advance(HandoffState.IN_TRANSFER, self.config.kv_lease_s)
        start = time.perf_counter()
        payloads = [self.codec.encode(b, self.blocks.layers(g)) for b, (g, _) in zip(blocks, wanted)]
        extra, frames = self.channel.pack(payloads)
        with self._lock:
            self._events.append(TransferEvent("sent", handle_id, "pull", "ok", sum(map(len, payloads)),
                                              seconds=time.perf_counter() - start))
        return {"ok": True, "codec": self.codec.name, "format": self.format.to_dict(), **extra}, frames

    # -- producer: pushes (the sender thread) --------------------------------------------------------
    def _send_loop(self) -> None:
        client = KVClient()
        started: dict[str, float] = {}
        sent_bytes: dict[str, int] = {}
        while (item := self._sends.get()) is not None:
            handle_id = item.push.handle_id
            if handle_id in self._push_failed:
                continue
            started.setdefault(handle_id, time.perf_counter())
            try:
                sent_bytes[handle_id] = sent_bytes.get(handle_id, 0) + self._send_push(client, item, handle_id not in sent_bytes)
            except TransferError as exc:
                self._push_failed.add(handle_id)
                refused = "no room" in str(exc)
                logger.warning("push of KV hand-off %s to %s failed (%s); it stays here for a pull", handle_id,
                               item.push.target, exc)
                with self._lock:
                    self._events.append(TransferEvent("sent", handle_id, "push", "refused" if refused else "failed",
                                                      sent_bytes.get(handle_id, 0), reason=str(exc)))
                continue
            if item.final:
                seconds = time.perf_counter() - started.pop(handle_id)
                if self._close_export(handle_id, "pushed") is not None:
                    with self._lock:
                        self._events.append(TransferEvent("sent", handle_id, "push", "ok", sent_bytes.pop(handle_id),
                                                          seconds=seconds))
        client.close()

    def _send_push(self, client: KVClient, item: _Outgoing, first: bool) -> int:
        payloads = [self.codec.encode(b, layers) for b, layers in zip(item.blocks, item.layers)]
        extra, frames = self.channel.pack(payloads)
        page = self.blocks.shape(0)
        reserve = item.push.total_pieces * max(len(g) for g in self.format.groups) * self.cache_dtype.itemsize
        for size in page[1:]:
            reserve *= size
        header = {"op": "push", "handle": item.push.handle_id, "codec": self.codec.name, "format": self.format.to_dict(),
                  "pieces": [[p.group, p.position, list(layers)] for p, layers in zip(item.pieces, item.layers)],
                  "final": item.final, "reserve_bytes": reserve, **extra}
        client.request(item.push.target, header, frames, self.config.kv_transfer_timeout_s)
        return sum(map(len, payloads))

    # -- consumer: loads (the loader thread) ---------------------------------------------------------
    def _load_loop(self) -> None:
        client = KVClient()
        down: dict[str, float] = {}  # producer -> until when it counts as unreachable
        checked: dict[str, str | None] = {}  # producer -> why its KV cannot be loaded here (None: it can)
        while (load := self._loads.get()) is not None:
            if isinstance(load, KVHandle):
                self._release(client, load.producer, load.handle_id)
                continue
            start = time.perf_counter()
            handoff = Handoff(load.handle.handle_id, HandoffState.RESERVED, time.monotonic())
            handoff.advance(HandoffState.IN_TRANSFER, self.config.kv_transfer_timeout_s)
            try:
                how, num_bytes = self._load(client, load, down, checked)
                handoff.advance(HandoffState.OWNED_BY_CONSUMER)
                event = TransferEvent("received", load.handle.handle_id, how, "ok", num_bytes,
                                      self._num_tokens(load), time.perf_counter() - start)
                ok = True
            except (TransferError, KVFormatError, ValueError, RuntimeError) as exc:
                handoff.advance(HandoffState.FAILED)
                logger.warning("request %s: loading KV hand-off %s from %s failed (%s); it prefills itself",
                               load.req_id, load.handle.handle_id, load.handle.producer, exc)
                event = TransferEvent("received", load.handle.handle_id, "pull", "failed", 0, 0,
                                      time.perf_counter() - start, str(exc))
                ok = False
            with self._lock:
                self._finished_loading[load.req_id] = ok
                self._events.append(event)
                self._num_loading -= 1
                self._lock.notify_all()
        client.close()

    def _num_tokens(self, load: LoadKV) -> int:
        full = [g for g, w in enumerate(self.format.sliding_windows) if w is None]
        return sum(1 for p in load.pieces if p.group == (full[0] if full else 0)) * self.format.block_size

    def _load(self, client: KVClient, load: LoadKV, down: dict[str, float],
              checked: dict[str, str | None]) -> tuple[str, int]:
        """Fill the load's blocks: from what was pushed here, else pulled; returns how and the bytes moved."""
        handle = load.handle
        if self._buffer.has(handle.handle_id) or handle.pushed_to == self.server.address:
            grace = min(PUSH_GRACE_S, self.config.kv_transfer_timeout_s)
            pushed = self._buffer.take(handle.handle_id, self.config.kv_transfer_timeout_s, grace)
            if pushed is not None:
                self._write_pushed(load, pushed)
                return "buffer", pushed.num_bytes
        producer = handle.producer
        if time.monotonic() < down.get(producer, 0.0):
            raise TransferError(f"the producer {producer} did not answer moments ago")
        try:
            self._check_producer(client, producer, handle.format, checked)
            reply, frames = client.request(producer, {"op": "pull", "handle": handle.handle_id,
                                                      "pieces": [[p.group, p.position] for p in load.pieces]},
                                           timeout_s=self.config.kv_transfer_timeout_s)
        except TransferError as exc:
            if "no answer" in str(exc):
                down[producer] = time.monotonic() + UNREACHABLE_S
            raise
        payloads = self.channel.unpack(reply, frames)
        source = KVFormat.from_dict(reply["format"])
        for piece, payload in zip(load.pieces, payloads):
            self._write_piece(piece, self.blocks.layers(piece.group), payload, reply["codec"], source)
        self._release(client, producer, handle.handle_id)
        return "pull", sum(len(p) for p in payloads)

    def _release(self, client: KVClient, producer: str, handle_id: str) -> None:
        """Tell the producer it may free its copy; a producer gone by now frees it when its lease ends."""
        try:
            client.request(producer, {"op": "release", "handle": handle_id}, timeout_s=RELEASE_TIMEOUT_S)
        except TransferError as exc:
            logger.warning("KV hand-off %s: the producer %s did not confirm the release (%s); its lease frees it",
                           handle_id, producer, exc)

    def _check_producer(self, client: KVClient, producer: str, claimed: KVFormat, checked: dict[str, str | None]) -> None:
        """Handshake once per producer: its KV must be loadable here (raises KVFormatError if not)."""
        if producer not in checked:
            reply, _ = client.request(producer, {"op": "hello"}, timeout_s=self.config.kv_transfer_timeout_s)
            try:
                self.format.check_compatible(KVFormat.from_dict(reply["format"]))
                checked[producer] = None
            except KVFormatError as exc:
                checked[producer] = str(exc)
        if checked[producer] is not None:
            raise KVFormatError(f"the producer at {producer}: {checked[producer]}")

    def _write_pushed(self, load: LoadKV, pushed: Pushed) -> None:
        for piece in load.pieces:
            parts = pushed.pieces.get((piece.group, piece.position))
            if not parts:
                raise TransferError(f"the push left out block {piece.position} of group {piece.group}")
            for layers, payload in parts:
                self._write_piece(piece, layers, payload, pushed.codec, pushed.format)

    def _write_piece(self, piece: Piece, layers: tuple[int, ...], payload: memoryview, codec_name: str,
                     source: KVFormat) -> None:
        """Decode one piece in the producer's format and write it into this cache in this one's dtype."""
        src_dtype = getattr(torch, source.cache_dtype)
        shape = list(self.blocks.shape(piece.group, layers))
        shape[-1] = row_width(source.head_dim, src_dtype)
        try:
            data = self._codec(codec_name).decode(payload, tuple(shape), src_dtype, layers)
        except (ValueError, RuntimeError) as exc:
            raise TransferError(f"a {codec_name} piece of block {piece.position} does not decode: {exc}") from None
        self.blocks.write(piece.group, piece.block_id, convert_rows(data, self.cache_dtype, self.head_dim), layers)

    def _codec(self, name: str) -> KVCodec:
        if name not in self._codecs:
            self._codecs[name] = make_codec(name, self.num_layers, torch.float32)
        return self._codecs[name]
