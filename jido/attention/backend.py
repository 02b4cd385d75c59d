"""The attention backend interface and the per-step metadata every backend reads."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    """Where each token of a flat, unpadded batch sits in the paged KV cache.

    The batch holds ``num_reqs`` requests laid out one after another: request ``i`` owns query rows
    ``query_start_loc[i]:query_start_loc[i + 1]``. Its queries are the *last* ``query_len`` tokens of a
    context of ``seq_len`` tokens (``seq_len - query_len`` tokens were computed in earlier steps and their
    K/V already sit in the cache), so query ``j`` of request ``i`` is at position
    ``seq_len - query_len + j``. That one shape covers a whole prefill, a prefill chunk on top of a cached
    prefix, and a decode (``query_len == 1``).

    Tensors live on the model's device; the ``*_list`` fields are the same numbers as Python ints so that
    backends can loop without device syncs.
    """

    query_start_loc: torch.Tensor  # [num_reqs + 1] int32, cumulative query lengths
    seq_lens: torch.Tensor  # [num_reqs] int32, context length including this step's tokens
    block_tables: torch.Tensor  # [num_reqs, max_num_blocks] int32, padded with 0
    slot_mapping: torch.Tensor  # [num_tokens] int64, cache slot (block_id * block_size + offset) per token
    block_size: int
    query_lens_list: list[int]
    seq_lens_list: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens_list)

    @property
    def is_decode_only(self) -> bool:
        return all(n == 1 for n in self.query_lens_list)


@dataclass(frozen=True)
class AttentionLayerSpec:
    """What one attention layer needs from a backend besides its inputs."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    scale: float
    sliding_window: int | None = None  # a query at p sees keys at p - sliding_window < k <= p
    logit_softcap: float | None = None


class AttentionBackend(ABC):
    """Computes causal attention for a flat batch against the paged KV cache.

    A layer's KV cache is one tensor ``[2, num_blocks, block_size, num_kv_heads, head_dim]`` (index 0 keys,
    1 values). ``forward`` first writes this step's ``k``/``v`` rows into their slots, then attends.

    Args of ``forward``:
        spec: the layer's head counts, scale, sliding window and soft-cap.
        q: ``[num_tokens, num_heads * head_dim]``, RoPE already applied.
        k, v: ``[num_tokens, num_kv_heads * head_dim]``, RoPE already applied to ``k``.
        kv_cache: the layer's cache tensor, written in place.
        metadata: the step's :class:`AttentionMetadata`.
    Returns:
        ``[num_tokens, num_heads * head_dim]`` in ``q``'s dtype.
    Invariants:
        The result for a request depends only on that request's tokens and cache blocks, never on which
        other requests share the batch (batched == unbatched).
    """

    name: str

    @abstractmethod
    def forward(
        self,
        spec: AttentionLayerSpec,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: AttentionMetadata,
    ) -> torch.Tensor: ...


def write_kv(kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Scatter this step's keys and values into their cache slots."""
    _, num_blocks, block_size, num_kv_heads, head_dim = kv_cache.shape
    # [num_blocks * block_size, num_kv_heads, head_dim] views share the cache's storage.
    kv_cache[0].view(-1, num_kv_heads, head_dim)[slot_mapping] = k.view(-1, num_kv_heads, head_dim)
    kv_cache[1].view(-1, num_kv_heads, head_dim)[slot_mapping] = v.view(-1, num_kv_heads, head_dim)
