"""The offload connector: LMCache-style tiers below the device pool, its two halves under one name."""
from __future__ import annotations

from typing import Any

import torch

from jido.config import EngineConfig
from jido.core.kv_cache_spec import KVCacheConfig
from jido.kvtransfer.offload_scheduler import OffloadScheduler
from jido.kvtransfer.offload_worker import OffloadWorker

__all__ = ["OffloadScheduler", "OffloadWorker", "make_scheduler", "make_worker"]


def make_scheduler(config: EngineConfig, kv_cache_config: KVCacheConfig, worker_info: dict[str, Any]) -> OffloadScheduler:
    return OffloadScheduler(config.kv_offload, kv_cache_config, worker_info["fingerprint"])


def make_worker(config: EngineConfig, fingerprints: dict[str, str], num_layers: int,
                cache_dtype: torch.dtype) -> OffloadWorker:
    return OffloadWorker(config.kv_offload, fingerprints["kv"], num_layers, cache_dtype)
