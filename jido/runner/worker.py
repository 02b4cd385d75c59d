"""Worker: one device's model runner behind the calls an executor makes, in-process or in a worker process."""
from __future__ import annotations

from pathlib import Path

from jido.config import EngineConfig
from jido.core.kv_cache_spec import KVCacheConfig, KVCacheSpec
from jido.core.outputs import ModelRunnerOutput, SchedulerOutput
from jido.runner.model_runner import ModelRunner


class Worker:
    """Loads the model on construction; executors call these methods directly or by name over RPC."""

    def __init__(self, config: EngineConfig, model_folder: Path, rank: int = 0) -> None:
        self.rank = rank
        self.config = config
        self.runner = ModelRunner(config, model_folder)

    def get_kv_cache_spec(self) -> dict[int, KVCacheSpec]:
        return self.runner.get_kv_cache_spec()

    def determine_available_memory(self) -> int:
        """Bytes this worker may give to the KV cache: ``kv_cache_memory`` (measured profiling comes with GPUs)."""
        return self.config.cache_config.kv_cache_bytes

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        self.runner.initialize_kv_cache(kv_cache_config)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute_model(scheduler_output)

    def kv_fingerprint(self) -> str:
        """What names this worker's stored KV (model, dtype, layout, block size, groups), once the cache exists."""
        return self.runner.fingerprint

    def shutdown(self) -> None:
        """Stop the KV connector's background transfers."""
        self.runner.shutdown()

    def check_health(self) -> None:
        """Raise if this worker cannot serve; a live in-process worker always can."""
