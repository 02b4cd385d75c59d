"""The disaggregation connector's per-step instructions (scheduler -> workers) and reports (workers -> scheduler)."""
from __future__ import annotations

from dataclasses import dataclass, field

from jido.kvtransfer.handoff import KVHandle


@dataclass(frozen=True)
class Piece:
    """One block position of one layer group and the pool block that holds it on this instance."""

    group: int
    position: int
    block_id: int


@dataclass(frozen=True)
class ExportKV:
    """Producer: once this step's forward is done the request's prompt KV is complete; serve it as ``handle_id``
    until a consumer releases it or ``lease_s`` passes, then report the request in ``finished_saving``."""

    req_id: str
    handle_id: str
    pieces: tuple[Piece, ...]
    lease_s: float


@dataclass(frozen=True)
class PushKV:
    """Producer: send these pieces to the consumer at ``target`` in this step (each layer right after the forward
    wrote it when ``layerwise``); ``final``: the prompt ends this step, and its end is sent after the pieces."""

    req_id: str
    handle_id: str
    target: str
    pieces: tuple[Piece, ...]
    final: bool
    total_pieces: int  # of the whole prompt, for the consumer's reservation


@dataclass(frozen=True)
class LoadKV:
    """Consumer: fill these blocks with the handle's KV (from what was pushed here, else pulled), then release it."""

    req_id: str
    handle: KVHandle
    pieces: tuple[Piece, ...]


@dataclass
class DisaggMetadata:
    exports: list[ExportKV] = field(default_factory=list)
    pushes: list[PushKV] = field(default_factory=list)
    loads: list[LoadKV] = field(default_factory=list)
    drops: list[str] = field(default_factory=list)  # handle ids whose producer request ended without a hand-off
    releases: list[KVHandle] = field(default_factory=list)  # consumer: handles it will not load (cached, refused)

    @property
    def is_empty(self) -> bool:
        return not (self.exports or self.pushes or self.loads or self.drops or self.releases)


@dataclass(frozen=True)
class TransferEvent:
    """One transfer that ended, as a worker saw it: ``direction`` sent (producer) or received (consumer).

    ``num_bytes`` are the bytes that crossed between the instances (encoded), ``seconds`` the time the
    transfer took on this side, ``how`` pull, push or buffer (pushed earlier, written now), ``result`` ok,
    failed, expired or released.
    """

    direction: str
    handle_id: str
    how: str
    result: str
    num_bytes: int = 0
    num_tokens: int = 0
    seconds: float = 0.0
    reason: str = ""
