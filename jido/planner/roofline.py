"""Roofline cost of one engine step (prefill tokens plus decode sequences) on one serving instance."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from jido.planner.catalog import PRECISION_BYTES, PRECISIONS, Accelerator, Efficiency, Residency
from jido.planner.model_shapes import ModelShape
from jido.planner.parallelism import ring_all_reduce_s, smallest_tp, tp_all_reduces_per_token

ACTIVATION_BYTES = 2  # all-reduced activations stay 16-bit


@dataclass(frozen=True)
class Role:
    """What one phase runs on: accelerator type, weight precision, KV precision."""

    accelerator: str
    weight_precision: str = "bf16"
    kv_precision: str = "bf16"

    def __post_init__(self) -> None:
        for key in ("weight_precision", "kv_precision"):
            if getattr(self, key) not in PRECISIONS:
                raise ValueError(f"{key} must be one of {PRECISIONS}, got {getattr(self, key)!r}")

    @property
    def label(self) -> str:
        return f"{self.accelerator}:{self.weight_precision}:{self.kv_precision}"

    @classmethod
    def parse(cls, text: str) -> Role:
        """'H100-SXM:fp8:fp8', 'A100-80G:bf16' or 'L4' (precisions default to bf16)."""
        parts = text.split(":")
        if not 1 <= len(parts) <= 3 or not parts[0]:
            raise ValueError(f"role {text!r} must look like ACCELERATOR[:WEIGHT_PRECISION[:KV_PRECISION]]")
        return cls(*parts)


@dataclass(frozen=True)
class StepBatch:
    """Work in one step: new prompt tokens (with their attention pairs) and decoding sequences."""

    num_prefill_tokens: int = 0
    num_attention_pairs: float = 0.0
    num_decode_seqs: int = 0
    num_kv_tokens: int = 0

    @staticmethod
    def prefill(num_tokens: int, num_cached_tokens: int = 0) -> StepBatch:
        """One prompt: causal attention over the cached prefix plus half the new tokens on average."""
        return StepBatch(num_tokens, num_tokens * (num_cached_tokens + num_tokens / 2))

    @staticmethod
    def decode(num_seqs: int, context_len: float) -> StepBatch:
        return StepBatch(num_decode_seqs=num_seqs, num_kv_tokens=round(num_seqs * context_len))


@dataclass(frozen=True)
class StepCost:
    """Roofline of one step: the larger of compute and memory time, plus communication and overhead."""

    flops: float
    device_bytes: float
    compute_s: float
    memory_s: float
    comm_s: float
    overhead_s: float
    peak_flops: float
    peak_bytes_s: float

    @property
    def time_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.comm_s + self.overhead_s

    @property
    def bound(self) -> str:
        return "compute" if self.compute_s >= self.memory_s else "memory"

    @property
    def compute_utilization(self) -> float:
        """Fraction of peak FLOPS used over the step."""
        return self.flops / self.time_s / self.peak_flops

    @property
    def bandwidth_utilization(self) -> float:
        """Fraction of peak device-memory bandwidth used over the step."""
        return self.device_bytes / self.time_s / self.peak_bytes_s


@dataclass(frozen=True)
class Instance:
    """One serving instance: a model on tp accelerators of one type, KV in a residency tier."""

    model: ModelShape
    role: Role
    accelerator: Accelerator
    residency: Residency
    efficiency: Efficiency
    tp: int

    @cached_property
    def weight_bytes(self) -> float:
        return self.model.num_params * PRECISION_BYTES[self.role.weight_precision]

    @cached_property
    def kv_bytes_per_element(self) -> float:
        return PRECISION_BYTES[self.role.kv_precision]

    @cached_property
    def kv_capacity_bytes(self) -> float:
        """KV cache room: leftover device memory, or the off-device tier's share per accelerator."""
        if not self.residency.on_device:
            return self.tp * self.residency.capacity_gb * 1e9
        usable = self.tp * self.accelerator.memory_gb * 1e9 * self.efficiency.usable_memory_fraction
        return max(0.0, usable - self.weight_bytes)

    @property
    def price_per_hour(self) -> float:
        return self.tp * self.accelerator.price_per_hour

    def kv_bytes(self, num_tokens: float) -> float:
        return self.model.kv_bytes(num_tokens, self.kv_bytes_per_element)

    def step(self, batch: StepBatch) -> StepCost:
        num_tokens = batch.num_prefill_tokens + batch.num_decode_seqs
        kv_read = self._kv_read_bytes(batch)
        kv_write = num_tokens * self.model.kv_bytes_per_token(self.kv_bytes_per_element)
        device_bytes = self._weight_bytes_read(num_tokens) + kv_write
        if self.residency.on_device:
            device_bytes += kv_read
        peak_flops = self.tp * self.accelerator.tflops[self.role.weight_precision] * 1e12
        peak_bytes_s = self.tp * self.accelerator.memory_tb_s * 1e12
        flops = self._flops(batch)
        return StepCost(
            flops=flops,
            device_bytes=device_bytes,
            compute_s=flops / (peak_flops * self.efficiency.compute),
            memory_s=device_bytes / (peak_bytes_s * self.efficiency.bandwidth) + self._offload_s(kv_read),
            comm_s=self._tp_comm_s(num_tokens),
            overhead_s=self.efficiency.step_overhead_ms * 1e-3 if num_tokens else 0.0,
            peak_flops=peak_flops,
            peak_bytes_s=peak_bytes_s,
        )

    def _flops(self, batch: StepBatch) -> float:
        m = self.model
        num_tokens = batch.num_prefill_tokens + batch.num_decode_seqs
        attention = m.attention_flops(1, batch.num_attention_pairs + batch.num_kv_tokens)
        # NOTE: the LM head runs for decode sequences only; a prompt needs logits for its last token.
        lm_head = 2 * m.hidden_size * m.vocab_size * batch.num_decode_seqs
        return 2 * m.num_active_params * num_tokens + attention + lm_head

    def _weight_bytes_read(self, num_tokens: int) -> float:
        """Dense weights once per step; an MoE step touches only the experts its tokens route to."""
        if num_tokens == 0:
            return 0.0
        m = self.model
        if not m.is_moe:
            return self.weight_bytes
        touched = 1 - (1 - m.num_active_experts / m.num_experts) ** num_tokens
        expert_bytes = m.num_layers * m.num_experts * m.expert_params * PRECISION_BYTES[self.role.weight_precision]
        return self.weight_bytes - expert_bytes * (1 - touched)

    def _kv_read_bytes(self, batch: StepBatch) -> float:
        if batch.num_decode_seqs == 0:
            return 0.0
        return batch.num_decode_seqs * self.kv_bytes(batch.num_kv_tokens / batch.num_decode_seqs)

    def _offload_s(self, kv_read: float) -> float:
        """KV held off the device streams over its tier link, paying the access latency per layer."""
        if self.residency.on_device or kv_read == 0:
            return 0.0
        latency = self.model.num_layers * self.residency.latency_us * 1e-6
        return kv_read / (self.tp * self.residency.gb_s * 1e9) + latency

    def _tp_comm_s(self, num_tokens: int) -> float:
        count = tp_all_reduces_per_token(self.model.num_layers, self.tp)
        if count == 0 or num_tokens == 0:
            return 0.0
        size = num_tokens * self.model.hidden_size * ACTIVATION_BYTES
        return count * ring_all_reduce_s(size, self.tp, self.accelerator.tp_link_gb_s,
                                         self.accelerator.tp_latency_us)


def build_instance(model: ModelShape, role: Role, accelerator: Accelerator, residency: Residency,
                   efficiency: Efficiency, min_kv_tokens: int, min_tp: int = 1) -> Instance | None:
    """The smallest-TP instance (at least ``min_tp``) that fits the weights and KV for min_kv_tokens, or None."""
    weight_bytes = model.num_params * PRECISION_BYTES[role.weight_precision]
    device_bytes = accelerator.memory_gb * 1e9 * efficiency.usable_memory_fraction
    tp = smallest_tp(weight_bytes, device_bytes, accelerator.max_tp)
    tp = None if tp is None or min_tp > accelerator.max_tp else max(tp, min_tp)
    while tp is not None and tp <= accelerator.max_tp:
        instance = Instance(model, role, accelerator, residency, efficiency, tp)
        if instance.kv_capacity_bytes >= instance.kv_bytes(min_kv_tokens):
            return instance
        tp *= 2
    return None
