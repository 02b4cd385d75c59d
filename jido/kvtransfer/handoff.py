"""The handed-off KV as an object: its format, model fingerprint, token hashes, where it lives, who owns it, its lease.

A producer that prefilled a prompt for another instance makes a :class:`KVHandle`; it leaves the producer in
the response's ``kv_transfer_params`` and comes back, through the router, in the consumer's request. The
handle says what the bytes are (:class:`KVFormat`: dtype, row layout, block size, scales, codec, layer
groups), which model made them (a fingerprint the consumer must match), which tokens they are the KV of
(chained block hashes and a hash of every prompt token, checked against the consumer's own prompt),
where they live and who owns them, and until when the producer keeps them (its lease).

Both sides follow one hand-off's life through :class:`Handoff`: ``reserved`` on the consumer (blocks, or
room for a push, set aside), ``in_transfer``, ``owned_by_consumer`` (every block written), and
``released`` by the producer (its blocks freed); or ``failed`` / ``expired`` when a step did not end
within its timeout, which frees that side's blocks.
"""
from __future__ import annotations

import enum
import hashlib
import time
from dataclasses import asdict, dataclass, field
from typing import Any


class KVFormatError(ValueError):
    """Two instances' KV cannot be exchanged: another model, block size or layer grouping."""


@dataclass(frozen=True)
class KVFormat:
    """What one instance's KV blocks are, as they travel: ``[layers, 2, block_size, num_kv_heads, width]`` per
    group block (K then V), ``width`` = ``head_dim``, plus 4 bytes of float32 scale per row when ``cache_dtype``
    is quantized (``scales`` says where scales live), encoded by ``codec``."""

    model: str  # fingerprint of the model config and weights, block size and layer groups: must match
    block_size: int
    groups: tuple[tuple[int, ...], ...]  # layer ids per KV cache group
    sliding_windows: tuple[int | None, ...]  # per group
    num_kv_heads: int
    head_dim: int
    cache_dtype: str  # torch's name: float32, bfloat16, float16, int8, float8_e4m3fn, float8_e5m2
    codec: str  # raw | int8 | cachegen
    layout: str = "layers,kv,block_size,kv_heads,width"

    @property
    def scales(self) -> str:
        """Where quantization scales travel: in each row (quantized cache), per channel in the payload (int8 and
        cachegen codecs), or nowhere (raw float)."""
        if self.cache_dtype in ("int8", "float8_e4m3fn", "float8_e5m2"):
            return "float32 per row, after its values"
        return "float16 per channel, in the payload" if self.codec != "raw" else "none"

    def check_compatible(self, other: KVFormat) -> None:
        """Raise KVFormatError unless KV in ``other``'s format can be loaded into this one's cache.

        dtype, codec and layout may differ (the receiver converts); model, block size and groups may not.
        """
        if other.model != self.model:
            raise KVFormatError("the instances serve different models (their KV fingerprints differ: config, "
                                "weights, block size or layer groups): give every prefill and decode instance "
                                "the same --model and --block-size")
        for name in ("block_size", "groups", "num_kv_heads", "head_dim"):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                raise KVFormatError(f"KV {name} differs between the instances ({theirs} there, {mine} here): "
                                    f"prefill and decode instances need the same {name}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: lists for tuples, and where the scales travel."""
        return {**asdict(self), "groups": [list(g) for g in self.groups],
                "sliding_windows": list(self.sliding_windows), "scales": self.scales}

    @classmethod
    def from_dict(cls, data: Any) -> KVFormat:
        try:
            return cls(model=str(data["model"]), block_size=int(data["block_size"]),
                       groups=tuple(tuple(int(i) for i in g) for g in data["groups"]),
                       sliding_windows=tuple(None if w is None else int(w) for w in data["sliding_windows"]),
                       num_kv_heads=int(data["num_kv_heads"]), head_dim=int(data["head_dim"]),
                       cache_dtype=str(data["cache_dtype"]), codec=str(data["codec"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"kv_transfer_params.format is malformed: {exc!r}") from None


def prompt_hash(token_ids: list[int]) -> str:
    """A hash of every prompt token: what a consumer checks the handed-over KV against (the last block too)."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class KVHandle:
    """A producer's handle to one prompt's KV: enough for a consumer to check it and fetch it.

    ``num_tokens`` prompt tokens' KV is held; ``block_hashes`` (hex) name its full blocks, chained as the
    prefix cache names them, so a consumer that already has a prefix fetches only the rest.
    ``lease_expires`` is wall-clock time (seconds since the epoch): after it the producer frees the KV.
    """

    handle_id: str
    producer: str  # the producer's KV endpoint, "tcp://host:port"
    transport: str  # shm | tcp | nixl
    mode: str  # pull | push
    format: KVFormat
    num_tokens: int
    token_hash: str
    block_hashes: tuple[str, ...] = ()
    lease_expires: float = 0.0
    residency: str = "producer"  # where the KV lives: producer (its device blocks), consumer (pushed there)
    owner: str = "producer"
    pushed_to: str | None = None  # push: the consumer endpoint the KV was sent to

    def to_params(self) -> dict[str, Any]:
        """The response's ``kv_transfer_params`` (vLLM's field): this handle, ready for a consumer request."""
        data = asdict(self)
        data["format"] = self.format.to_dict()
        data["block_hashes"] = list(self.block_hashes)
        return {"do_remote_prefill": True, **data}

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> KVHandle:
        """Parse a consumer request's ``kv_transfer_params``; raises ValueError naming what is wrong."""
        required = ("handle_id", "producer", "transport", "mode", "format", "num_tokens", "token_hash")
        missing = [k for k in required if k not in params]
        if missing:
            raise ValueError(f"kv_transfer_params with do_remote_prefill needs {', '.join(missing)} (the "
                             "kv_transfer_params a producer returned)")
        try:
            return cls(handle_id=str(params["handle_id"]), producer=str(params["producer"]),
                       transport=str(params["transport"]), mode=str(params["mode"]),
                       format=KVFormat.from_dict(params["format"]), num_tokens=int(params["num_tokens"]),
                       token_hash=str(params["token_hash"]),
                       block_hashes=tuple(str(h) for h in params.get("block_hashes", ())),
                       lease_expires=float(params.get("lease_expires", 0.0)),
                       residency=str(params.get("residency", "producer")), owner=str(params.get("owner", "producer")),
                       pushed_to=params.get("pushed_to"))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"kv_transfer_params is malformed: {exc}") from None


@dataclass(frozen=True)
class ProduceRequest:
    """A producer request's ``kv_transfer_params``: prefill, hold the KV, and (push) send it to ``push_to``."""

    push_to: str | None = None  # a consumer's KV endpoint, "tcp://host:port"


def parse_transfer_params(params: Any, is_producer: bool, is_consumer: bool) -> ProduceRequest | KVHandle | None:
    """A request's ``kv_transfer_params`` for an instance of that role; raises ValueError for bad ones.

    ``{"do_remote_decode": true[, "remote_host", "remote_port"]}`` asks a producer to prefill and hold the KV
    (push it to that consumer); ``{"do_remote_prefill": true, ...}`` brings a producer's handle to a consumer.
    """
    if params is None:
        return None
    if not isinstance(params, dict):
        raise ValueError(f"kv_transfer_params must be an object, got {type(params).__name__}")
    if params.get("do_remote_decode"):
        if not is_producer:
            raise ValueError("kv_transfer_params asks do_remote_decode, but this instance is no KV producer "
                             "(its kv_transfer_config kv_role is kv_consumer)")
        host, port = params.get("remote_host"), params.get("remote_port")
        if (host is None) != (port is None):
            raise ValueError("kv_transfer_params: remote_host and remote_port go together (the consumer to push to)")
        return ProduceRequest(None if host is None else f"tcp://{host}:{int(port)}")
    if params.get("do_remote_prefill"):
        if not is_consumer:
            raise ValueError("kv_transfer_params brings do_remote_prefill, but this instance is no KV consumer "
                             "(its kv_transfer_config kv_role is kv_producer)")
        return KVHandle.from_params(params)
    return None


class HandoffState(enum.Enum):
    RESERVED = "reserved"  # consumer: blocks (pull) or buffer room (push) set aside; producer: KV held
    IN_TRANSFER = "in_transfer"
    OWNED_BY_CONSUMER = "owned_by_consumer"  # every block written on the consumer
    RELEASED = "released"  # the producer freed its copy
    FAILED = "failed"
    EXPIRED = "expired"  # a step ran past its timeout: that side's blocks are freed

    @property
    def is_final(self) -> bool:
        return self in (HandoffState.RELEASED, HandoffState.FAILED, HandoffState.EXPIRED)


_NEXT = {
    HandoffState.RESERVED: {HandoffState.IN_TRANSFER, HandoffState.RELEASED, HandoffState.FAILED,
                            HandoffState.EXPIRED},
    HandoffState.IN_TRANSFER: {HandoffState.OWNED_BY_CONSUMER, HandoffState.RESERVED, HandoffState.FAILED,
                               HandoffState.EXPIRED},
    HandoffState.OWNED_BY_CONSUMER: {HandoffState.RELEASED, HandoffState.EXPIRED},
}


@dataclass
class Handoff:
    """One side's view of a hand-off: its state, and the deadline by which the current step must end."""

    handle_id: str
    state: HandoffState
    deadline: float  # time.monotonic() by which the state must change, else it expires
    history: list[str] = field(default_factory=list)

    def advance(self, state: HandoffState, timeout_s: float | None = None) -> None:
        """Move to ``state``; a non-final state gets ``timeout_s`` more to end. Raises ValueError for a bad move."""
        if state not in _NEXT.get(self.state, set()):
            raise ValueError(f"hand-off {self.handle_id}: cannot go from {self.state.value} to {state.value}")
        self.history.append(self.state.value)
        self.state = state
        if timeout_s is not None:
            self.deadline = time.monotonic() + timeout_s

    def expired(self, now: float | None = None) -> bool:
        return not self.state.is_final and (time.monotonic() if now is None else now) > self.deadline
