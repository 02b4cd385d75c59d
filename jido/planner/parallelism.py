"""Communication counts and costs of tensor, pipeline and expert parallelism."""

from __future__ import annotations


def tp_all_reduces_per_token(num_layers: int, tp: int) -> int:
    """Megatron-style TP all-reduces once after attention and once after the MLP in every layer."""
    return 0 if tp == 1 else 2 * num_layers


def pp_transfers(num_stages: int) -> int:
    """Activations cross each of the p-1 stage boundaries once per micro-batch."""
    if num_stages < 1:
        raise ValueError(f"num_stages must be >= 1, got {num_stages}")
    return num_stages - 1


def pipeline_bubble(num_stages: int, num_micro_batches: int) -> float:
    """Idle fraction of a GPipe/1F1B schedule: (p - 1) / (m + p - 1)."""
    if num_stages < 1 or num_micro_batches < 1:
        raise ValueError(f"stages and micro-batches must be >= 1, got {num_stages}, {num_micro_batches}")
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)


def ep_all_to_alls(num_moe_layers: int, ep: int) -> int:
    """Expert parallelism dispatches tokens to experts and combines them back: 2 per MoE layer."""
    return 0 if ep == 1 else 2 * num_moe_layers


def ring_all_reduce_s(num_bytes: float, tp: int, link_gb_s: float, latency_us: float) -> float:
    """Ring all-reduce: each rank sends and receives 2(t-1)/t of the buffer, in 2(t-1) hops."""
    if tp == 1:
        return 0.0
    if link_gb_s <= 0:
        raise ValueError("tensor parallelism needs a link between devices")
    hops = 2 * (tp - 1)
    return hops / tp * num_bytes / (link_gb_s * 1e9) + hops * latency_us * 1e-6


def smallest_tp(weight_bytes: float, device_bytes: float, max_tp: int) -> int | None:
    """The smallest power-of-two TP degree whose per-device weight shard fits, or None."""
    tp = 1
    while tp <= max_tp:
        if weight_bytes / tp <= device_bytes:
            return tp
        tp *= 2
    return None
