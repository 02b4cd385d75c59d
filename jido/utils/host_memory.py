"""The host's available memory, and the start-up check that a CPU engine's KV cache and step workspace fit in it.

A CPU engine that asks for more than the machine has is not refused by anything: it pages in until the kernel's
OOM killer ends it, mid-request. vLLM refuses at start-up when the KV cache does not fit the GPU's memory; this is
the same check against the host's ``MemAvailable``, made once the weights are loaded (they are already counted).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

MEMINFO = Path("/proc/meminfo")
GIB = 1 << 30


class InsufficientMemoryError(ValueError):
    """The KV cache and the step workspace do not fit in the memory the host has available."""


def mem_available_bytes(meminfo: Path = MEMINFO) -> int | None:
    """The kernel's estimate of memory available to a new allocation without swapping (None where unknown)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class StepWorkspace:
    """What a step allocates beside the weights and the KV cache, at most: float32 logits for every sampled row and
    the largest activations of a full prefill step (a gated MLP's gate and up outputs, and a few hidden-size
    buffers)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    vocab_size: int
    hidden_size: int
    intermediate_size: int

    @property
    def bytes(self) -> int:
        logits = self.max_num_seqs * self.vocab_size
        activations = self.max_num_batched_tokens * (2 * self.intermediate_size + 4 * self.hidden_size)
        return 4 * (logits + activations)


def check_kv_cache_fits(kv_cache_bytes: int, workspace: StepWorkspace, weights_bytes: int,
                        available_bytes: int | None) -> None:
    """Raise :class:`InsufficientMemoryError` when the KV cache plus the step workspace exceed ``available_bytes``
    (measured after the weights were loaded), with every size and the ``kv_cache_memory`` that would fit. No check
    where the available memory is unknown."""
    if available_bytes is None:
        return
    needed = kv_cache_bytes + workspace.bytes
    if needed <= available_bytes:
        return
    fits = available_bytes - workspace.bytes
    advice = (f"start with --kv-cache-memory {max(fits, 0) // (1 << 20)}MiB or less" if fits > 0 else
              "even an empty KV cache does not fit: lower --max-num-batched-tokens and --max-num-seqs, use a smaller "
              "model, or free memory")
    raise InsufficientMemoryError(
        f"not enough memory: the KV cache (kv_cache_memory, {kv_cache_bytes / GIB:.2f} GiB) and the step workspace "
        f"(~{workspace.bytes / GIB:.2f} GiB for {workspace.max_num_seqs} sequences and "
        f"{workspace.max_num_batched_tokens} batched tokens) need {needed / GIB:.2f} GiB, but this machine has "
        f"{available_bytes / GIB:.2f} GiB available with the weights ({weights_bytes / GIB:.2f} GiB) loaded; {advice}")
