"""The attention backend interface, the common per-step metadata every backend builds from, and its factory."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from jido.utils.host_copy import to_device


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
    backends can loop without device syncs. ``block_tables`` and ``slot_mapping`` are one KV cache group's
    (each group of layers has its own block table per request); the rest is the same for every group.
    Build it with :func:`build_common_metadata`; each backend turns it into its own metadata once per step
    and group (:meth:`AttentionBackend.build_metadata`).
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
    """Computes causal attention for a flat batch against the paged KV cache, in a layout it owns.

    The runner allocates each layer's cache with :meth:`get_kv_cache_shape` (zero-filled) and, once per
    step and KV cache group, turns the common metadata into the backend's own with
    :meth:`build_metadata`; the model never names the layout.

    Args of ``forward``:
        spec: the layer's head counts, scale, sliding window and soft-cap.
        q: ``[num_tokens, num_heads * head_dim]``, RoPE already applied.
        k, v: ``[num_tokens, num_kv_heads * head_dim]``, RoPE already applied to ``k``.
        kv_cache: the layer's cache tensor; ``forward`` first writes this step's ``k``/``v`` rows into their
            slots (``metadata``'s slot mapping), quantized if the cache's dtype is int8 or fp8, then attends.
        metadata: what :meth:`build_metadata` returned for the layer's group this step.
    Returns:
        ``[num_tokens, num_heads * head_dim]`` in ``q``'s dtype. With a quantized cache it equals attention
        over the dequantized keys and values (computed in float32 or better).
    Invariants:
        The result for a request depends only on that request's tokens and cache blocks, never on which
        other requests share the batch (batched == unbatched). Slots outside a request's visible keys
        (padding, blocks a sliding window has passed) are never read unmasked.
    """

    name: str
    # The token axis of one block, ``kv_cache[:, block_id]``: 1 for ``[2, block_size, kv_heads, width]``. KV
    # connectors move blocks in a layout of their own (tokens on axis 1) and turn them with this.
    block_token_dim: int = 1
    # Whether a decode step may be captured in a CUDA graph and replayed (jido/runner/cuda_graphs.py): the backend's
    # forward then makes no host decision from the metadata's device tensors, copies nothing between host and
    # device, reads only the metadata's tensors (refreshed in place before each replay) and decides from its Python
    # fields once, at capture, as for contexts of the longest length.
    supports_cuda_graphs: bool = False
    # Whether the backend takes ``batch_invariant=True`` at construction: then a query row's result is the same bits
    # whatever else its step holds and however its request's tokens were split into steps (alone or batched, a whole
    # prompt, a chunk, a suffix after a cached prefix, a decode).
    supports_batch_invariance: bool = False

    @staticmethod
    @abstractmethod
    def get_kv_cache_shape(num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                           dtype: torch.dtype | None = None) -> tuple[int, ...]:
        """The shape of one layer's cache tensor of element type ``dtype`` holding ``num_blocks`` blocks.

        A quantized ``dtype`` (int8, fp8: :mod:`jido.attention.kv_quant`) widens each (token, KV head) row by
        its scale's bytes; ``None`` or a float type keeps rows of ``head_dim``.
        """

    @abstractmethod
    def build_metadata(self, common: AttentionMetadata) -> Any:
        """This backend's metadata for one step of one KV cache group (called once, shared by its layers)."""

    @abstractmethod
    def forward(
        self,
        spec: AttentionLayerSpec,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        metadata: Any,
    ) -> torch.Tensor: ...


def build_common_metadata(query_lens: list[int], seq_lens: list[int], block_table: np.ndarray, block_size: int,
                          device: torch.device | str = "cpu") -> AttentionMetadata:
    """The common metadata of one KV cache group for a flat batch (used by the runner and the tests).

    ``block_table`` is ``[num_reqs, max_num_blocks]`` int32, padded with any valid block id.
    """
    return build_groups_metadata(query_lens, seq_lens, [block_table], block_size, device)[0]


def build_groups_metadata(query_lens: list[int], seq_lens: list[int], block_tables: list[np.ndarray],
                          block_size: int, device: torch.device | str = "cpu") -> list[AttentionMetadata]:
    """:func:`build_common_metadata` for each KV cache group's block table, the same flat batch: what the groups
    share (positions, query starts, context lengths) is computed once and its tensors shared, read-only. Gemma 3
    has six groups, and building each whole was a large share of a one-row step's input preparation."""
    query_lens_np = np.asarray(query_lens, dtype=np.int64)
    seq_lens_np = np.asarray(seq_lens, dtype=np.int64)
    query_start_loc = np.concatenate([[0], np.cumsum(query_lens_np)]).astype(np.int32)
    # Positions of every query token: the last query_len positions of each request's context.
    req_index = np.repeat(np.arange(len(query_lens)), query_lens_np)
    positions = np.arange(int(query_start_loc[-1])) - query_start_loc[req_index] + (seq_lens_np - query_lens_np)[req_index]
    block_of, offset = positions // block_size, positions % block_size
    query_start_loc_t = to_device(query_start_loc, device)
    seq_lens_t = to_device(seq_lens_np.astype(np.int32), device)
    query_lens_list, seq_lens_list = list(query_lens), list(seq_lens)
    return [AttentionMetadata(
        query_start_loc=query_start_loc_t, seq_lens=seq_lens_t,
        block_tables=to_device(np.ascontiguousarray(table, dtype=np.int32), device),
        slot_mapping=to_device(table[req_index, block_of].astype(np.int64) * block_size + offset, device),
        block_size=block_size, query_lens_list=query_lens_list, seq_lens_list=seq_lens_list)
        for table in block_tables]


@dataclass(frozen=True)
class StepAttentionMetadata:
    """What a model's forward needs about attention for one step: each layer's backend metadata.

    ``max_seq_len`` is the longest context in the batch, as a Python int, so RoPE tables can be sized
    without reading a device tensor.
    """

    per_layer: list[Any]
    max_seq_len: int


def build_step_metadata(backend: AttentionBackend, group_metadata: list[AttentionMetadata],
                        layer_groups: list[int]) -> StepAttentionMetadata:
    """Build each group's backend metadata once and hand layer ``i`` its group's (``layer_groups[i]``)."""
    built = [backend.build_metadata(common) for common in group_metadata]
    return StepAttentionMetadata([built[g] for g in layer_groups], max(group_metadata[0].seq_lens_list))
