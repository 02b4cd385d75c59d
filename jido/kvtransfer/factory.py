"""Which KV connector an engine runs, built for the scheduler side and for each worker (lazily imported)."""
from __future__ import annotations

import importlib
from typing import Any

import torch

from jido.config import EngineConfig
from jido.core.kv_cache_spec import KVCacheConfig
from jido.core.kv_connector import KVConnectorScheduler
from jido.kvtransfer.base import KVConnectorWorker

# connector name -> the module whose make_scheduler / make_worker build its two halves
CONNECTORS: dict[str, str] = {
    "offload": "jido.kvtransfer.offload_connector",
    "disagg": "jido.kvtransfer.disagg_connector",
}


def connector_name(config: EngineConfig) -> str | None:
    """The connector the configuration asks for: ``kv_transfer_config`` disaggregates, ``kv_offload`` offloads.

    Raises:
        ValueError: both are set (one connector per engine).
    """
    if config.kv_transfer_config is not None and config.kv_offload is not None:
        raise ValueError("kv_transfer_config and kv_offload each need the engine's KV connector: set one of them")
    if config.kv_transfer_config is not None:
        return "disagg"
    return "offload" if config.kv_offload is not None else None


def make_scheduler_connector(config: EngineConfig, kv_cache_config: KVCacheConfig,
                             worker_info: dict[str, Any]) -> KVConnectorScheduler | None:
    """The scheduler half; ``worker_info`` is what the first worker reported (``Worker.kv_connector_info``)."""
    name = connector_name(config)
    return None if name is None else importlib.import_module(CONNECTORS[name]).make_scheduler(
        config, kv_cache_config, worker_info)


def make_worker_connector(config: EngineConfig, fingerprints: dict[str, str], num_layers: int,
                          cache_dtype: torch.dtype) -> KVConnectorWorker | None:
    """The worker half; ``fingerprints``: ``kv`` names this worker's exact KV bytes, ``model`` its model's."""
    name = connector_name(config)
    return None if name is None else importlib.import_module(CONNECTORS[name]).make_worker(
        config, fingerprints, num_layers, cache_dtype)
