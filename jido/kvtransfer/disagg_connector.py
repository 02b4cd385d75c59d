"""The disaggregation connector: KV handed from prefill (producer) to decode (consumer) instances over a transport."""
from __future__ import annotations

from typing import Any

import torch

from jido.config import EngineConfig
from jido.core.kv_cache_spec import KVCacheConfig
from jido.kvtransfer.disagg_scheduler import DisaggScheduler
from jido.kvtransfer.disagg_worker import DisaggWorker
from jido.kvtransfer.handoff import KVFormat

__all__ = ["DisaggScheduler", "DisaggWorker", "make_scheduler", "make_worker"]


def make_scheduler(config: EngineConfig, kv_cache_config: KVCacheConfig, worker_info: dict[str, Any]) -> DisaggScheduler:
    return DisaggScheduler(config.kv_transfer_config, kv_cache_config, KVFormat.from_dict(worker_info["format"]),
                           worker_info["address"])


def make_worker(config: EngineConfig, fingerprints: dict[str, str], num_layers: int,
                cache_dtype: torch.dtype) -> DisaggWorker:
    return DisaggWorker(config.kv_transfer_config, fingerprints["model"], num_layers, cache_dtype)
