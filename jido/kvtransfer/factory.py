"""Which KV connector an engine runs, built for the scheduler side and for each worker (lazily imported)."""
from __future__ import annotations

import importlib

import torch

from jido.config import EngineConfig
from jido.core.kv_cache_spec import KVCacheConfig
from jido.core.kv_connector import KVConnectorScheduler
from jido.kvtransfer.base import KVConnectorWorker

# connector name -> (module, scheduler-side class, worker-side class)
CONNECTORS: dict[str, tuple[str, str, str]] = {
    "offload": ("jido.kvtransfer.offload_connector", "OffloadScheduler", "OffloadWorker"),
}


def connector_name(config: EngineConfig) -> str | None:
    """The connector the configuration asks for; None for none (``kv_offload`` picks the offload one)."""
    return "offload" if config.kv_offload is not None else None


def _class(name: str, index: int) -> type:
    module, *classes = CONNECTORS[name]
    return getattr(importlib.import_module(module), classes[index])


def make_scheduler_connector(config: EngineConfig, kv_cache_config: KVCacheConfig,
                             fingerprint: str) -> KVConnectorScheduler | None:
    name = connector_name(config)
    return None if name is None else _class(name, 0)(config.kv_offload, kv_cache_config, fingerprint)


def make_worker_connector(config: EngineConfig, fingerprint: str, num_layers: int,
                          cache_dtype: torch.dtype) -> KVConnectorWorker | None:
    name = connector_name(config)
    return None if name is None else _class(name, 1)(config.kv_offload, fingerprint, num_layers, cache_dtype)
