"""EngineCore: the step loop that joins the scheduler to the executor."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from jido.config import EngineConfig
from jido.core.kv_cache_manager import KVCacheManager
from jido.core.outputs import EngineCoreOutput
from jido.core.request import Request, RequestStatus
from jido.core.scheduler import Scheduler, SchedulerLimits
from jido.executor.uniproc import UniprocExecutor

logger = logging.getLogger("jido")


@dataclass(frozen=True)
class KVCachePlan:
    bytes_per_token: int
    num_blocks: int
    max_model_len: int


@dataclass
class StepTimes:
    """Where the last step's time went, for metrics and profiling."""

    schedule_s: float = 0.0
    model_s: float = 0.0
    sample_s: float = 0.0
    update_s: float = 0.0
    num_tokens: int = 0


def plan_kv_cache(config: EngineConfig, bytes_per_token: int, model_max_len: int) -> KVCachePlan:
    """Size the block pool from ``kv_cache_memory`` and settle ``max_model_len``."""
    block_bytes = bytes_per_token * config.block_size
    num_blocks = config.kv_cache_bytes // block_bytes
    if num_blocks < 1:
        raise ValueError(f"kv_cache_memory={config.kv_cache_memory!r} holds no KV block: one block of "
                         f"{config.block_size} tokens takes {block_bytes} bytes")
    capacity = num_blocks * config.block_size
    if config.max_model_len is not None:
        if config.max_model_len > model_max_len:
            raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's limit of {model_max_len}")
        if config.max_model_len > capacity:
            raise ValueError(f"max_model_len={config.max_model_len} does not fit in the KV cache "
                             f"({capacity} tokens in {config.kv_cache_memory!r}); raise kv_cache_memory to at "
                             f"least {config.max_model_len * bytes_per_token} bytes or lower max_model_len")
        max_model_len = config.max_model_len
    else:
        max_model_len = min(model_max_len, capacity)
    logger.info("KV cache: %d bytes per token, %d blocks of %d tokens (%d tokens), %.1f requests of "
                "max_model_len=%d fit", bytes_per_token, num_blocks, config.block_size, capacity,
                capacity / max_model_len, max_model_len)
    return KVCachePlan(bytes_per_token, num_blocks, max_model_len)


class EngineCore:
    """Owns the scheduler and the executor; ``step()`` runs one iteration of continuous batching."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.executor = UniprocExecutor(config)
        runner = self.executor.runner
        self.model_config = runner.model_config
        self.kv_plan = plan_kv_cache(config, runner.kv_bytes_per_token, self.model_config.max_position_embeddings)
        self.executor.initialize_kv_cache(self.kv_plan.num_blocks)
        kv_manager = KVCacheManager(self.kv_plan.num_blocks, config.block_size, config.enable_prefix_caching)
        limits = SchedulerLimits(config.max_num_seqs, config.max_num_batched_tokens, self.kv_plan.max_model_len)
        self.scheduler = Scheduler(limits, kv_manager)
        self.last_step = StepTimes()

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, req_ids: list[str]) -> None:
        self.scheduler.finish_requests(req_ids, RequestStatus.FINISHED_ABORTED)

    def finish_requests(self, req_ids: list[str]) -> None:
        """Stop requests that ended outside the step (a stop string matched in the detokenized text)."""
        self.scheduler.finish_requests(req_ids, RequestStatus.FINISHED_STOPPED)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def step(self) -> list[EngineCoreOutput]:
        start = time.perf_counter()
        scheduler_output = self.scheduler.schedule()
        scheduled = time.perf_counter()
        runner_output = self.executor.execute_model(scheduler_output)
        ran = time.perf_counter()
        outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        self.last_step = StepTimes(scheduled - start, runner_output.model_time_s, runner_output.sample_time_s,
                                   time.perf_counter() - ran, scheduler_output.total_num_scheduled_tokens)
        return outputs
