"""KV cache transfer from a prefill instance to a decode instance: bytes on the wire, codec and link time."""

from __future__ import annotations

from dataclasses import dataclass

from jido.planner.catalog import Link, WireFormat
from jido.planner.roofline import Instance

OWNERSHIPS = ("push", "pull")


@dataclass(frozen=True)
class KVTransfer:
    """Per-request transfer of num_tokens of KV; all times in seconds."""

    num_tokens: float
    wire_bytes: float
    encode_s: float
    link_s: float
    decode_s: float
    num_layers: int
    layerwise: bool

    @property
    def total_s(self) -> float:
        """Sender encodes, link carries, receiver converts; nothing overlapped."""
        return self.encode_s + self.link_s + self.decode_s

    def exposed_s(self, prefill_s: float) -> float:
        """Time added to TTFT: layer-wise sending hides the link behind prefill except the last layer."""
        if not self.layerwise:
            return self.total_s
        link = max(self.link_s - prefill_s, self.link_s / self.num_layers)
        return (self.encode_s + self.decode_s) / self.num_layers + link


@dataclass(frozen=True)
class LinkPlan:
    """Everything that decides how KV moves: link, wire format, ownership, overlap."""

    link: Link
    wire: WireFormat
    ownership: str
    layerwise: bool = True

    def __post_init__(self) -> None:
        if self.ownership not in OWNERSHIPS:
            raise ValueError(f"ownership must be one of {OWNERSHIPS}, got {self.ownership!r}")

    def link_gb_s(self, prefill: Instance, decode: Instance) -> float:
        """Bandwidth one prefill instance sends with: one link per accelerator of the instance."""
        return prefill.tp * self.link.bandwidth_gb_s(prefill.accelerator, decode.accelerator)

    def transferred_tokens(self, input_len: float, prefix_share: float) -> float:
        """With decode pulling, it fetches only blocks its own prefix cache lacks."""
        if self.ownership == "pull":
            return input_len * (1 - prefix_share)
        return input_len

    def transfer(self, prefill: Instance, decode: Instance, input_len: float, prefix_share: float) -> KVTransfer:
        num_tokens = self.transferred_tokens(input_len, prefix_share)
        elements = prefill.model.kv_bytes(num_tokens, 1.0)
        stored_bpe = prefill.kv_bytes_per_element
        wire_bpe = self._wire_bytes_per_element(stored_bpe)
        wire_bytes = elements * wire_bpe
        round_trips = 2 if self.ownership == "pull" else 1
        link_s = wire_bytes / (self.link_gb_s(prefill, decode) * 1e9) + round_trips * self.link.latency_us * 1e-6
        return KVTransfer(
            num_tokens=num_tokens,
            wire_bytes=wire_bytes,
            encode_s=self._codec_s(prefill, elements, stored_bpe, wire_bpe),
            link_s=link_s,
            decode_s=self._receive_s(prefill, decode, elements, wire_bpe),
            num_layers=prefill.model.num_layers,
            layerwise=self.layerwise,
        )

    def _wire_bytes_per_element(self, stored_bpe: float) -> float:
        if self.wire.ratio is None:
            return 1.0
        return stored_bpe * self.wire.ratio

    def _codec_s(self, inst: Instance, elements: float, from_bpe: float, to_bpe: float) -> float:
        """Encode (or decode) on one instance: a codec's throughput, or one read plus one write."""
        if self.wire.codec_gb_s is not None:
            return elements * max(from_bpe, to_bpe) / (inst.tp * self.wire.codec_gb_s * 1e9)
        if from_bpe == to_bpe and self.wire.ratio is not None:
            return 0.0
        bandwidth = inst.tp * inst.accelerator.memory_tb_s * 1e12 * inst.efficiency.bandwidth
        return elements * (from_bpe + to_bpe) / bandwidth

    def _receive_s(self, prefill: Instance, decode: Instance, elements: float, wire_bpe: float) -> float:
        """Decode converts what arrives into its own KV precision (FP8 prefill into BF16 decode pays this)."""
        decode_bpe = decode.kv_bytes_per_element
        if self.wire.codec_gb_s is not None:
            return self._codec_s(decode, elements, wire_bpe, decode_bpe)
        arrives_as = prefill.role.kv_precision if self.wire.ratio is not None else "8-bit"
        if arrives_as == decode.role.kv_precision or (arrives_as == "8-bit" and decode_bpe == 1.0):
            return 0.0
        bandwidth = decode.tp * decode.accelerator.memory_tb_s * 1e12 * decode.efficiency.bandwidth
        return elements * (wire_bpe + decode_bpe) / bandwidth


def required_link_gb_s(kv_bytes_per_request: float, rate: float) -> float:
    """Sustained bandwidth to move every request's KV: bytes per request times requests per second."""
    return kv_bytes_per_request * rate / 1e9


def link_verdict(required_gb_s: float, available_gb_s: float) -> str:
    """'ok' when the link carries the load, 'insufficient' when it cannot."""
    return "ok" if required_gb_s <= available_gb_s else "insufficient"
