"""DisaggScheduler: the disaggregation connector's scheduler side — what a producer holds and pushes, what a
consumer loads.

Producer: a request that asks ``do_remote_decode`` runs as any other; in the step that computes the end of
its prompt the workers are told to export its KV (and, pushing, to send each step's finished blocks to the
consumer as they are computed). When it finishes its blocks stay held (``request_finished`` says so) until
the workers report the hand-off over: released by the consumer, pushed and acknowledged, or its lease
gone. Its last output carries the :class:`KVHandle`.

Consumer: a request that brings a handle loads every prompt token's KV but the last one's (it computes that
token itself, which samples the first output token as a co-located run would) beyond its own prefix-cache
hit; of each sliding-window group only the blocks the last token can see. A handle for another model or
block size, or for other tokens than the request's prompt, is refused with a warning: the request
prefills itself.
"""
from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from jido.config.kv_transfer import KVTransferConfig
from jido.core.kv_cache_manager import positions_to_load
from jido.core.kv_cache_spec import KVCacheConfig, SlidingWindowSpec
from jido.core.kv_connector import KVConnectorOutput, KVConnectorScheduler, ReleasedBlock
from jido.core.outputs import SchedulerOutput
from jido.core.request import Request, RequestStatus
from jido.kvtransfer.disagg_metadata import DisaggMetadata, ExportKV, LoadKV, Piece, PushKV, TransferEvent
from jido.kvtransfer.handoff import KVFormat, KVFormatError, KVHandle, ProduceRequest, prompt_hash
from jido.metrics.stats import KVTransferStats

logger = logging.getLogger("jido")


@dataclass
class _Production:
    """A producer request in flight: where its KV goes, how far it was pushed, and its handle once prefilled."""

    request: Request
    push_to: str | None
    handle_id: str
    num_pushed: int = 0  # leading block positions already pushed
    handle: KVHandle | None = None


class DisaggScheduler(KVConnectorScheduler):
    """Plans hand-offs on both roles; the workers (``DisaggWorker``) move the bytes through the transport."""

    def __init__(self, config: KVTransferConfig, kv_cache_config: KVCacheConfig, kv_format: KVFormat,
                 address: str) -> None:
        self.config = config
        self.block_size = kv_cache_config.block_size
        self.windows = [g.spec.sliding_window if isinstance(g.spec, SlidingWindowSpec) else None
                        for g in kv_cache_config.groups]
        self.format = kv_format
        self.address = address
        self._engine_id = uuid.uuid4().hex[:12]
        self._producing: dict[str, _Production] = {}
        self._loads: dict[str, KVHandle] = {}  # consumer requests offered a load, until it is allocated
        self._tried: set[str] = set()  # consumer requests whose handle was looked at (one load per request)
        self._meta = DisaggMetadata()
        self._stats = KVTransferStats(config.kv_role, config.kv_connector)
        self._counts: dict[str, float] = {}

    # -- admission ---------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> int:
        params = request.kv_transfer_params
        if isinstance(params, ProduceRequest):
            if request.request_id not in self._producing:
                handle_id = f"{self._engine_id}-{request.request_id}"
                self._producing[request.request_id] = _Production(request, params.push_to, handle_id)
            return 0
        if not isinstance(params, KVHandle) or request.request_id in self._tried:
            return 0
        self._tried.add(request.request_id)
        reason = self._refusal(request, params)
        if reason is not None:
            self._count("failed")
            logger.warning("request %s: not loading KV handle %s (%s); it prefills itself", request.request_id,
                           params.handle_id, reason)
        num_external = request.num_prompt_tokens - 1 - num_computed_tokens
        if reason is not None or num_external <= 0:  # refused, or all cached here: the producer may free it
            self._meta.releases.append(params)
            return 0
        self._loads[request.request_id] = params
        return num_external

    def _refusal(self, request: Request, handle: KVHandle) -> str | None:
        """Why this request may not load this handle's KV, or None when it may."""
        try:
            self.format.check_compatible(handle.format)
        except KVFormatError as exc:
            return str(exc)
        if handle.transport != self.config.kv_connector:
            return f"the producer sends over {handle.transport!r}, this instance over {self.config.kv_connector!r}"
        if handle.num_tokens != request.num_prompt_tokens or handle.token_hash != prompt_hash(request.prompt_token_ids):
            return "the handle holds the KV of another prompt"
        return None

    def update_state_after_alloc(self, request: Request, block_ids: list[list[int]], num_computed_tokens: int,
                                 num_external_tokens: int) -> None:
        handle = self._loads.pop(request.request_id)
        end = num_computed_tokens + num_external_tokens
        pieces = self._pieces(block_ids, num_computed_tokens, end)
        self._meta.loads.append(LoadKV(request.request_id, handle, pieces))

    def _pieces(self, block_ids: list[list[int]], start: int, end: int, first_position: int = 0,
                last_position: int | None = None) -> tuple[Piece, ...]:
        """The pieces KV for tokens ``start..end - 1`` fills (the window rule), between two block positions."""
        pieces = []
        for group, window in enumerate(self.windows):
            for position in positions_to_load(window, self.block_size, start, end):
                if first_position <= position and (last_position is None or position < last_position):
                    pieces.append(Piece(group, position, block_ids[group][position]))
        return tuple(pieces)

    # -- the step ----------------------------------------------------------------------------------
    def on_blocks_released(self, blocks: list[ReleasedBlock]) -> None:
        """Nothing to keep: a consumer's blocks stay in its own prefix cache."""

    def build_connector_meta(self, scheduler_output: SchedulerOutput,
                             block_ids: Callable[[str], list[list[int]]]) -> DisaggMetadata | None:
        for req_id, production in self._producing.items():
            num_new = scheduler_output.num_scheduled_tokens.get(req_id)
            if num_new is not None and not production.request.output_token_ids:
                self._plan_production(production, num_new, block_ids(req_id))
        meta, self._meta = self._meta, DisaggMetadata()
        return None if meta.is_empty else meta

    def _plan_production(self, production: _Production, num_new: int, block_ids: list[list[int]]) -> None:
        """Pushes of the blocks this step completes and, in the step that ends the prompt, the export."""
        request = production.request
        num_prompt = request.num_prompt_tokens
        completes = request.num_computed_tokens + num_new >= num_prompt
        # What a consumer loads: every prompt token's KV but the last one's (see the module docstring).
        needed = self._pieces(block_ids, 0, num_prompt - 1)
        if production.push_to is not None:
            done = num_prompt if completes else (request.num_computed_tokens + num_new) // self.block_size * self.block_size
            last = -(-done // self.block_size)
            pieces = tuple(p for p in needed if production.num_pushed <= p.position < last)
            if pieces or completes:
                self._meta.pushes.append(PushKV(request.request_id, production.handle_id, production.push_to, pieces,
                                                completes, len(needed)))
            production.num_pushed = last
        if completes:
            self._meta.exports.append(ExportKV(request.request_id, production.handle_id, needed, self.config.kv_lease_s))
            production.handle = KVHandle(
                production.handle_id, self.address, self.config.kv_connector, self.config.kv_mode, self.format,
                num_prompt, prompt_hash(request.prompt_token_ids), tuple(h.hex() for h in request.block_hashes),
                time.time() + self.config.kv_lease_s, pushed_to=production.push_to)

    # -- endings -----------------------------------------------------------------------------------
    def request_finished(self, request: Request, block_ids: list[list[int]]) -> tuple[bool, dict | None]:
        if isinstance(request.kv_transfer_params, KVHandle) and request.request_id not in self._tried:
            self._meta.releases.append(request.kv_transfer_params)  # ended before it was admitted
        self._tried.discard(request.request_id)
        self._loads.pop(request.request_id, None)
        production = self._producing.pop(request.request_id, None)
        if production is None or production.handle is None:
            return False, None
        if request.status != RequestStatus.FINISHED_LENGTH:
            # Stopped on its first token (nothing left to decode) or aborted: nobody will fetch the KV.
            self._meta.drops.append(production.handle_id)
            return False, None
        self._count("held", 1)
        return True, production.handle.to_params()

    def update_connector_output(self, output: KVConnectorOutput) -> None:
        self._count("held", -len(output.finished_saving))
        for event in output.events:
            if isinstance(event, TransferEvent):
                self._record(event)

    def _record(self, event: TransferEvent) -> None:
        if event.result == "expired":
            self._count("expired")
        elif event.result == "refused":
            self._count("push_refused")
        elif event.result != "ok":
            self._count("failed")
        elif event.direction == "sent":
            self._count("sent")
            self._count("sent_bytes", event.num_bytes)
            self._count("sent_seconds", event.seconds)
        else:
            self._count("received")
            self._count("received_bytes", event.num_bytes)
            self._count("received_tokens", event.num_tokens)
            self._count("received_seconds", event.seconds)

    def _count(self, key: str, amount: float = 1) -> None:
        self._counts[key] = self._counts.get(key, 0) + amount

    def stats(self) -> tuple[KVTransferStats, ...]:
        c = self._counts
        return (KVTransferStats(self.config.kv_role, self.config.kv_connector, int(c.get("sent", 0)),
                                int(c.get("sent_bytes", 0)), c.get("sent_seconds", 0.0), int(c.get("received", 0)),
                                int(c.get("received_bytes", 0)), int(c.get("received_tokens", 0)),
                                c.get("received_seconds", 0.0), int(c.get("failed", 0)), int(c.get("expired", 0)),
                                int(c.get("push_refused", 0)), int(c.get("held", 0))),)
