"""KVTransferConfig: vLLM's ``--kv-transfer-config`` JSON (prefill/decode disaggregation), validated."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from jido.config.size import parse_size

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
KV_CONNECTORS = ("shm", "tcp")  # the transport that carries KV between instances
KV_MODES = ("pull", "push")
KV_WIRE_CODECS = ("raw", "int8", "cachegen")


@dataclass(frozen=True)
class KVTransferConfig:
    """Which transport moves KV between instances, this instance's role in it, and how the hand-off goes.

    ``kv_producer`` prefills requests that ask ``do_remote_decode`` and holds their KV for a consumer;
    ``kv_consumer`` loads the KV of requests that bring a handle (``do_remote_prefill``) and decodes;
    ``kv_both`` does either. Any role still serves plain requests (the router's fallback).
    """

    kv_connector: str
    kv_role: str = "kv_both"
    kv_ip: str = "127.0.0.1"
    kv_port: int = 14579  # where this instance's KV endpoint listens; 0 picks a free port
    kv_mode: str = "pull"  # pull: the consumer fetches when it has room; push: the producer sends as prefill ends
    kv_layerwise: bool = True  # push: send each layer's KV as soon as the forward wrote it (else after the forward)
    kv_codec: str = "raw"  # the KV's representation on the wire (jido.kvtransfer.codecs)
    kv_buffer_size: Any = "256MiB"  # a consumer's room for pushed KV that no request has claimed yet
    kv_lease_s: float = 60.0  # a producer frees KV nobody fetched (or a consumer, pushed KV nobody claimed) after this
    kv_transfer_timeout_s: float = 10.0  # a consumer gives up on a transfer after this and prefills itself

    def __post_init__(self) -> None:
        if self.kv_connector == "nixl":
            raise ValueError("kv_connector 'nixl' is not built in this jido (its package installs and moves DRAM "
                             "buffers here, see docs/disaggregation.md): use 'shm' on one host or 'tcp'")
        if self.kv_connector not in KV_CONNECTORS:
            raise ValueError(f"kv_connector must be one of {', '.join(KV_CONNECTORS)} (the KV transport), "
                             f"got {self.kv_connector!r}")
        for name, value, allowed in (("kv_role", self.kv_role, KV_ROLES), ("kv_mode", self.kv_mode, KV_MODES),
                                     ("kv_codec", self.kv_codec, KV_WIRE_CODECS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
        if not isinstance(self.kv_port, int) or isinstance(self.kv_port, bool) or not 0 <= self.kv_port < 65536:
            raise ValueError(f"kv_port must be a TCP port in 0..65535 (0 picks a free one), got {self.kv_port!r}")
        if not isinstance(self.kv_ip, str) or not self.kv_ip:
            raise ValueError(f"kv_ip must be an address to listen on, like '127.0.0.1', got {self.kv_ip!r}")
        if not isinstance(self.kv_layerwise, bool):
            raise ValueError(f"kv_layerwise must be true or false, got {self.kv_layerwise!r}")
        for name in ("kv_lease_s", "kv_transfer_timeout_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value < float("inf"):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        try:
            self.buffer_bytes
        except ValueError as exc:
            raise ValueError(f"kv_buffer_size: {exc}") from None

    @cached_property
    def buffer_bytes(self) -> int:
        return parse_size(self.kv_buffer_size)

    @property
    def is_producer(self) -> bool:
        return self.kv_role in ("kv_producer", "kv_both")

    @property
    def is_consumer(self) -> bool:
        return self.kv_role in ("kv_consumer", "kv_both")
