"""The KV connector seam, worker side: what a model runner calls to move its KV blocks in and out."""
from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from typing import Any

import torch

from jido.core.kv_cache_spec import KVCacheConfig
from jido.core.kv_connector import KVConnectorOutput
from jido.kvtransfer.block_io import BlockIO


class KVConnectorWorker(ABC):
    """Executes the scheduler side's per-step instructions against this worker's KV cache tensors.

    Call order in one step (the model runner's): :meth:`bind_connector_metadata` with the step's
    ``SchedulerOutput.kv_connector_metadata``; :meth:`start_load_kv` before the forward (and before the
    forward writes any block: blocks evicted this step still hold their old contents here); during the
    forward, per attention layer in order, :meth:`wait_for_layer_load` before it reads its cache and
    :meth:`save_kv_layer` after it wrote it; :meth:`wait_for_save` after the forward;
    :meth:`get_finished` last, whose report goes back in ``ModelRunnerOutput.kv_connector_output``.

    Invariants:
        - Only blocks named in the metadata are read or written, and a block being loaded is written
          by nothing else until its load is reported finished.
        - Failures are reported (``finished_loading[req] = False``, events), never raised into the step:
          a store that is down costs recompute, not the engine.
    """

    def register_kv_caches(self, kv_caches: list[torch.Tensor], kv_cache_config: KVCacheConfig,
                           block_token_dim: int) -> None:
        """The cache tensor of every layer (``kv_caches[i]`` for layer ``i``), once, before the first step.

        Block ``b`` of a layer is ``kv_caches[i][:, b]``; ``block_token_dim`` is the token axis within it
        (the backend's layout: 1 for ``[2, block_size, kv_heads, width]``, 2 for ``[2, kv_heads, block_size,
        width]``).
        """
        self.kv_caches = kv_caches
        self.kv_cache_config = kv_cache_config
        self.block_token_dim = block_token_dim
        self.blocks = BlockIO(kv_caches, kv_cache_config, block_token_dim)

    @abstractmethod
    def bind_connector_metadata(self, metadata: Any) -> None:
        """This step's instructions from the scheduler side."""

    @abstractmethod
    def start_load_kv(self) -> None:
        """Before the forward: take what must be read before the step writes, and start this step's loads."""

    def wait_for_layer_load(self, layer_id: int) -> None:
        """Block until ``layer_id``'s part of any synchronous load is in place (layer-wise transfer)."""

    def save_kv_layer(self, layer_id: int, kv_cache: torch.Tensor, attn_metadata: Any) -> None:
        """``layer_id``'s cache was just written by the forward: send or keep what the metadata asks."""

    def wait_for_save(self) -> None:
        """After the forward: block until the saves the next step depends on are safe to overwrite."""

    @abstractmethod
    def get_finished(self, idle: bool) -> KVConnectorOutput:
        """Transfers that ended since the last call; with ``idle`` (nothing ran this step) wait briefly for one."""

    def shutdown(self) -> None:
        """Stop background transfers; called once when the worker stops."""

    def info(self) -> dict[str, Any]:
        """What the scheduler side (and, through the engine, a router) needs to know about this worker's half."""
        return {}


def kv_fingerprint(parts: dict[str, object]) -> str:
    """32 hex digits naming what makes stored KV reusable: model, weights' quantization, dtype, KV layout and
    block size, layer groups. Engines that compute the same fingerprint may share stored blocks."""
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]
