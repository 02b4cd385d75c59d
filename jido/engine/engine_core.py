"""EngineCore: the step loop that joins the scheduler to the executor, and the KV cache sizing between them."""
from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
import time
from dataclasses import dataclass
from pathlib import Path

from jido.config import EngineConfig
from jido.core.kv_cache_manager import KVCacheManager
from jido.core.kv_cache_spec import (KVCacheConfig, SlidingWindowSpec, blocks_per_request, make_kv_cache_config,
                                    peak_blocks_per_request)
from jido.core.outputs import EngineCoreOutputs
from jido.core.pinned_prefixes import PinTooLargeError, TooManyPinsError
from jido.core.request import Request, RequestStatus
from jido.core.scheduler import Scheduler, SchedulerLimits
from jido.executor.abstract import Executor, get_executor_class
from jido.kvtransfer.factory import connector_name, make_scheduler_connector
from jido.metrics.stats import IterationStats, SchedulerStats
from jido.models.config import ModelArchConfig

logger = logging.getLogger("jido")


@dataclass(frozen=True)
class KVCachePlan:
    """The block pool laid over the layers, and the request length it serves."""

    kv_cache_config: KVCacheConfig
    max_model_len: int
    max_concurrency: float  # full-length requests that decode at once


def plan_kv_cache(config: EngineConfig, kv_cache_config: KVCacheConfig, model_max_len: int) -> KVCachePlan:
    """Settle ``max_model_len`` against the model's limit and the pool, and log how many requests fit.

    A sliding-window group holds about its window per decoding request, but while a request prefills a
    chunk it holds the window plus the chunk. ``max_model_len`` is the longest request whose peak fits
    the pool alone (and, without chunked prefill, one step's token budget); the concurrency figure keeps one
    such prefill's extra blocks aside, not one per request.
    """
    budget = config.scheduler_config.max_num_batched_tokens
    capacity = _max_request_len(kv_cache_config, budget, model_max_len)
    requested = config.model_config.max_model_len
    # NOTE: without chunked prefill a whole prompt, or a preempted request's whole recompute, is one step.
    whole_prompts = not config.scheduler_config.enable_chunked_prefill
    if requested is not None:
        if requested > model_max_len:
            raise ValueError(f"max_model_len={requested} exceeds the model's limit of {model_max_len}")
        if whole_prompts and requested > budget:
            raise ValueError(f"max_model_len={requested} exceeds max_num_batched_tokens={budget}: with "
                             "enable_chunked_prefill off a request is computed in one step; raise "
                             "max_num_batched_tokens or turn chunked prefill on")
        if requested > capacity:
            raise ValueError(f"max_model_len={requested} does not fit in the KV cache ({capacity} tokens in "
                             f"{config.cache_config.kv_cache_memory!r}, {kv_cache_config.block_bytes} bytes per "
                             "block); raise kv_cache_memory or lower max_model_len")
        max_model_len = requested
    elif capacity == 0:
        need = peak_blocks_per_request(kv_cache_config, kv_cache_config.block_size, budget)
        raise ValueError(f"{config.cache_config.kv_cache_memory!r} of KV cache holds {kv_cache_config.num_blocks} "
                         f"blocks of {kv_cache_config.block_bytes} bytes; even a {kv_cache_config.block_size}-token "
                         f"request needs {need}: raise kv_cache_memory")
    else:
        max_model_len = min(capacity, budget) if whole_prompts else capacity
    steady = blocks_per_request(kv_cache_config, max_model_len)
    reserve = peak_blocks_per_request(kv_cache_config, max_model_len, budget) - steady
    concurrency = (kv_cache_config.num_blocks - reserve) / steady
    groups = ", ".join(f"{len(g.layer_ids)} layers " + (f"window {g.spec.sliding_window}"
                       if isinstance(g.spec, SlidingWindowSpec) else "full") for g in kv_cache_config.groups)
    logger.info("KV cache (%s): %d blocks of %d tokens, %d bytes each; %d groups (%s)",
                config.cache_config.kv_cache_dtype, kv_cache_config.num_blocks, kv_cache_config.block_size,
                kv_cache_config.block_bytes, len(kv_cache_config.groups), groups)
    logger.info("Maximum concurrency for %d tokens per request: %.2fx", max_model_len, concurrency)
    return KVCachePlan(kv_cache_config, max_model_len, concurrency)


def _max_request_len(kv: KVCacheConfig, budget: int, model_max_len: int) -> int:
    """The longest request (up to the model's limit) whose peak, prefill chunks included, fits the pool."""
    if kv.num_blocks < peak_blocks_per_request(kv, kv.block_size, budget):
        return 0
    low, high = kv.block_size, model_max_len  # peak grows with the length: bisect for the last that fits
    while low < high:
        mid = (low + high + 1) // 2
        if peak_blocks_per_request(kv, mid, budget) <= kv.num_blocks:
            low = mid
        else:
            high = mid - 1
    return low


class EngineCore:
    """Owns the scheduler and the executor; ``step()`` runs one iteration of continuous batching.

    The model is resolved above (``model_folder``, ``model_arch``); the executor reports what the KV
    cache needs per layer and gets the pool laid out for it. Stats leave as records, never as live state.
    """

    def __init__(self, config: EngineConfig, model_folder: Path, model_arch: ModelArchConfig,
                 executor_class: type[Executor] | None = None) -> None:
        self.config = config
        if config.kv_offload is not None and not config.cache_config.enable_prefix_caching:
            raise ValueError("kv_offload keeps the blocks the prefix cache evicts: it needs enable_prefix_caching")
        has_connector = connector_name(config) is not None  # raises when both connectors are asked for
        executor_class = executor_class or get_executor_class(config.parallel_config.executor_backend)
        self.executor = executor_class(config, model_folder)
        try:
            self.kv_plan = self._initialize_kv_cache(model_arch)
        except BaseException:
            self.executor.shutdown()
            raise
        kv_config = self.kv_plan.kv_cache_config
        windows = [g.spec.sliding_window if isinstance(g.spec, SlidingWindowSpec) else None for g in kv_config.groups]
        kv_manager = KVCacheManager(kv_config.num_blocks, kv_config.block_size,
                                    config.cache_config.enable_prefix_caching, windows)
        sched = config.scheduler_config
        connector = None
        self.kv_connector_info: dict = {}
        self.kernel_fallbacks = self.executor.kernel_fallbacks()
        if has_connector:
            self.kv_connector_info = self.executor.collective_rpc("kv_connector_info")[0]
            connector = make_scheduler_connector(config, kv_config, self.kv_connector_info)
        spec = config.speculative_config
        # Room after each running request for the proposals the runner may hand back.
        lookahead = 0 if spec is None else spec.max_num_speculative_tokens
        limits = SchedulerLimits(sched.max_num_seqs, sched.max_num_batched_tokens, self.kv_plan.max_model_len,
                                 lookahead, policy=sched.scheduling_policy,
                                 enable_chunked_prefill=sched.enable_chunked_prefill,
                                 scheduling_mode=sched.scheduling_mode, max_batch_wait_s=sched.max_batch_wait_ms / 1000,
                                 max_num_prefill_tokens_while_decoding=sched.max_num_prefill_tokens_while_decoding)
        self.scheduler = Scheduler(limits, kv_manager, connector)

    def _initialize_kv_cache(self, model_arch: ModelArchConfig) -> KVCachePlan:
        specs = self.executor.get_kv_cache_spec()
        available = self.executor.determine_available_memory()
        try:
            kv_cache_config = make_kv_cache_config(specs, available)
        except ValueError as exc:
            raise ValueError(f"kv_cache_memory={self.config.cache_config.kv_cache_memory!r}: {exc}") from None
        plan = plan_kv_cache(self.config, kv_cache_config, model_arch.max_position_embeddings)
        self.executor.initialize_kv_cache(kv_cache_config)
        self.executor.capture_model(plan.max_model_len)
        return plan

    def add_request(self, request: Request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, req_ids: list[str]) -> None:
        self.scheduler.finish_requests(req_ids, RequestStatus.FINISHED_ABORTED)

    def finish_requests(self, req_ids: list[str]) -> None:
        """Stop requests that ended outside the step (a stop string matched in the detokenized text)."""
        self.scheduler.finish_requests(req_ids, RequestStatus.FINISHED_STOPPED)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests()

    def get_scheduler_stats(self) -> SchedulerStats:
        return self.scheduler.stats()

    def check_pin_fits(self, num_tokens: int, reserved_blocks: int = 0, num_prefilling: int = 0) -> int:
        """The pool blocks a pin of ``num_tokens`` tokens holds once prefilled.

        A pin is taken only if a request of ``max_model_len`` tokens still fits beside every pin, so pins never
        starve, preempt or evict running work (the pin's own prefill waits for room as any request does).

        Raises:
            ValueError: ``num_tokens`` is less than a block: a pin holds whole blocks, so it would hold nothing.
            TooManyPinsError: ``max_pinned_prefixes`` are pinned, counting ``num_prefilling`` still prefilling.
            PinTooLargeError: it does not fit beside the pins held and ``reserved_blocks`` still prefilling.
        """
        kv, limit = self.kv_plan.kv_cache_config, self.config.cache_config.max_pinned_prefixes
        block_size = kv.block_size
        if num_tokens < block_size:
            raise ValueError(f"the prompt has {num_tokens} tokens, less than one KV block ({block_size} tokens): a pin "
                             "holds whole blocks, so it would hold nothing; pin a longer prefix")
        if len(self.scheduler.pins) + num_prefilling >= limit:
            raise TooManyPinsError(f"max_pinned_prefixes={limit} prefixes are pinned or being pinned already: unpin "
                                   "one (DELETE /v1/cache/{id}) or raise max_pinned_prefixes")
        needed = blocks_per_request(kv, num_tokens + 1)
        peak = peak_blocks_per_request(kv, self.kv_plan.max_model_len, self.config.scheduler_config.max_num_batched_tokens)
        room = self.scheduler.pins.room(peak) - reserved_blocks
        if needed > room:
            raise PinTooLargeError(
                f"pinning {num_tokens} tokens holds {needed} KV blocks, but only {max(room, 0)} of the pool's "
                f"{kv.num_blocks} can be pinned while a {self.kv_plan.max_model_len}-token request still fits "
                f"beside the pins ({self.scheduler.pins.num_blocks} blocks are pinned): unpin a prefix, lower "
                "max_model_len or raise kv_cache_memory")
        return needed

    def pin_prefix(self, pin_id: str, token_ids: list[int]) -> int:
        """Pin the cached blocks of a prefix just prefilled; returns the tokens they cover."""
        return self.scheduler.pins.pin(pin_id, token_ids)

    def unpin_prefix(self, pin_id: str) -> None:
        self.scheduler.pins.unpin(pin_id)

    def reset_prefix_cache(self) -> None:
        self.scheduler.kv.reset_prefix_cache()

    def num_cached_tokens(self, token_ids: list[int]) -> int:
        """Leading tokens of ``token_ids`` whose blocks the device prefix cache holds in every layer group."""
        return self.scheduler.kv.num_cached_tokens(token_ids)

    def check_health(self) -> None:
        self.executor.check_health()

    def collective_rpc(self, method: str | Callable[..., Any], args: tuple = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        return self.executor.collective_rpc(method, args, kwargs)

    def has_pending_kv_work(self) -> bool:
        """Whether the KV connector waits for a step to hand its workers saves (of blocks the last step released)."""
        return self.scheduler.has_pending_kv_work()

    def shutdown(self) -> None:
        if self.scheduler.has_pending_kv_work():  # blocks the last step (or an abort) released still go to the tiers
            try:
                self.step()
            except Exception as exc:  # noqa: BLE001 - a failed worker: what it would have saved is lost, no more
                logger.warning("KV offload saves pending at shutdown were dropped: %s", exc)
        self.executor.shutdown()

    def step(self) -> EngineCoreOutputs:
        start = time.perf_counter()
        scheduler_output = self.scheduler.schedule()
        scheduled = time.perf_counter()
        kv_cache_usage_peak = self.scheduler.kv_cache_usage  # blocks are only allocated by schedule()
        runner_output = self.executor.execute_model(scheduler_output)
        ran = time.perf_counter()
        outputs = self.scheduler.update_from_output(scheduler_output, runner_output)
        stats = IterationStats(
            schedule_s=scheduled - start, prepare_s=runner_output.prepare_time_s, model_s=runner_output.model_time_s,
            sample_s=runner_output.sample_time_s, update_s=time.perf_counter() - ran,
            num_tokens=scheduler_output.total_num_scheduled_tokens,
            num_reqs=len(scheduler_output.num_scheduled_tokens), queue_times_s=self.scheduler.take_queue_times(),
            kv_cache_usage_peak=kv_cache_usage_peak, propose_s=runner_output.propose_time_s,
            expert_load=tuple(runner_output.expert_load))
        return EngineCoreOutputs(outputs, self.scheduler.stats(), stats)
