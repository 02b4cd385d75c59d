"""Worker: one rank's model runner behind the calls an executor makes, in-process or in a worker process."""
from __future__ import annotations

import gc
import time
from pathlib import Path

import torch

from jido.config import EngineConfig
from jido.core.kv_cache_spec import KVCacheConfig, KVCacheSpec
from jido.core.outputs import ModelRunnerOutput, SchedulerOutput
from jido.parallel.group import CommStats
from jido.parallel.state import ModelParallel, destroy_model_parallel, init_model_parallel
from jido.runner.model_runner import ModelRunner
from jido.runner.model_loading import resolve_device, weight_bytes
from jido.runner.pipeline_runner import PipelineModelRunner
from jido.utils import cpp_build
from jido.utils.host_memory import check_kv_cache_fits, mem_available_bytes
from jido.utils.malloc_policy import give_back_free_memory, keep_freed_blocks, release_freed_blocks


class Worker:
    """Joins its rank's process groups, then loads its shard of the model; executors call these methods
    directly or by name over RPC.

    Args:
        rank: this worker's global rank (``pp_rank * tensor_parallel_size + tp_rank``).
        distributed_init_method: ``tcp://host:port`` where rank 0 hosts the rendezvous (None for one worker).
        num_threads: torch threads for this rank, so that ranks sharing a machine do not oversubscribe it.
    """

    def __init__(self, config: EngineConfig, model_folder: Path, rank: int = 0,
                 distributed_init_method: str | None = None, num_threads: int | None = None) -> None:
        self.rank = rank
        self.config = config
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        parallel_config = config.parallel_config
        self.parallel = ModelParallel.single()
        if parallel_config.world_size > 1:
            self.parallel = init_model_parallel(
                rank, parallel_config.tensor_parallel_size, parallel_config.pipeline_parallel_size,
                parallel_config.enable_expert_parallel, distributed_init_method,
                parallel_config.distributed_timeout_seconds, resolve_device(config.device_config.device))
        runner_class = PipelineModelRunner if parallel_config.pipeline_parallel_size > 1 else ModelRunner
        self.runner = runner_class(config, model_folder, self.parallel)
        self.is_output_rank = rank == parallel_config.output_rank
        self.num_steps, self.step_s = 0, 0.0  # for parallel_stats
        self.closed = False
        self.holds_malloc_policy = False  # released at shutdown only if taken, so others' holds stay counted

    def get_kv_cache_spec(self) -> dict[int, KVCacheSpec]:
        return self.runner.get_kv_cache_spec()

    def determine_available_memory(self) -> int:
        """Bytes this worker may give to the KV cache: ``kv_cache_memory`` (measured profiling comes with GPUs).

        Raises:
            InsufficientMemoryError: on CPU, the KV cache and the step workspace do not fit in the host's available
                memory with the weights loaded.
        """
        kv_cache_bytes = self.config.cache_config.kv_cache_bytes
        if self.runner.device.type == "cpu":
            give_back_free_memory()  # what the load freed is available, and counted so
            check_kv_cache_fits(kv_cache_bytes, self.runner.step_workspace(), weight_bytes(self.runner.model),
                                mem_available_bytes())
        return kv_cache_bytes

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        self.runner.initialize_kv_cache(kv_cache_config)
        if self.runner.device.type == "cpu":  # from here on steps, not the load, make the large blocks
            self.holds_malloc_policy = keep_freed_blocks()

    def capture_model(self, max_model_len: int) -> None:
        self.runner.capture_model(max_model_len)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        """The step's output on the output rank; None elsewhere (every rank sampled the same, nothing to send)."""
        start = time.perf_counter()
        output = self.runner.execute_model(scheduler_output)
        self.num_steps += 1
        self.step_s += time.perf_counter() - start
        return output if self.is_output_rank else None

    def parallel_stats(self, reset: bool = False) -> dict:
        """Since the last reset: collective calls, bytes and seconds per group (``tp``, ``pp``, ``ep``; one group
        may hold two roles), the steps run and their seconds, and a pipeline stage's seconds of compute."""
        stats = {name: group.stats.as_dict() for name, group in self.parallel.groups.items()}
        stats.update(num_steps=self.num_steps, step_s=self.step_s, busy_s=getattr(self.runner, "busy_s", None))
        if reset:
            for group in self.parallel.groups.values():
                group.stats = CommStats()
            self.num_steps, self.step_s = 0, 0.0
            if hasattr(self.runner, "busy_s"):
                self.runner.busy_s = 0.0
        return stats

    def kernel_fallbacks(self) -> dict[str, str]:
        """The C++ kernel libraries this worker's process failed to build: what runs instead, and why."""
        return cpp_build.fallbacks()

    def kv_connector_info(self) -> dict:
        """Once the cache exists: the fingerprint naming this worker's stored KV (model, dtype, layout, block size,
        groups) and what its KV connector's worker half reports (a KV endpoint's address and format)."""
        return self.runner.kv_connector_info()

    def shutdown(self) -> None:
        """Stop the KV connector's background transfers, leave the parallel groups, then let go of the model and
        its KV cache: an engine that is shut down gives its memory back though its caller still holds it."""
        if self.closed:
            return
        self.runner.shutdown()
        destroy_model_parallel()
        self.closed = True
        on_cpu = self.runner.device.type == "cpu"
        del self.runner  # the only reference to the model, its KV cache and step buffers; calls after this fail
        if on_cpu:
            gc.collect()  # modules and hooks refer to each other: the weights go only with their cycles
        if self.holds_malloc_policy:
            release_freed_blocks()
            self.holds_malloc_policy = False

    def check_health(self) -> None:
        """Raise if this worker cannot serve; a live in-process worker always can."""
