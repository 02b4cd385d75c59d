"""The executor interface: how the engine core drives the workers that hold the model, wherever they run."""
from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from jido.config import EngineConfig
from jido.core.kv_cache_spec import KVCacheConfig, KVCacheSpec
from jido.core.outputs import ModelRunnerOutput, SchedulerOutput

# distributed_executor_backend -> (module, class), imported only when asked for.
_EXECUTORS: dict[str, tuple[str, str]] = {
    "uni": ("jido.executor.uniproc_executor", "UniprocExecutor"),
    "mp": ("jido.executor.multiproc_executor", "MultiprocExecutor"),
    "ray": ("jido.executor.ray_executor", "RayExecutor"),
}


class WorkerError(RuntimeError):
    """A worker failed or died; the engine cannot run further steps."""


class Executor(ABC):
    """Runs the workers of one engine: reports their KV needs, sets up their caches, executes steps.

    Contract:
        - Construction starts the workers and loads the model (already resolved to ``model_folder``).
        - :meth:`collective_rpc` calls a :class:`jido.runner.worker.Worker` method on every worker and
          returns their results in rank order; the other methods are built on it.
        - :meth:`execute_model` sends one :class:`SchedulerOutput` (picklable: new requests in full,
          running ones as diffs) to every rank and returns the output rank's :class:`ModelRunnerOutput`
          (``ParallelConfig.output_rank``: the first TP rank of the last pipeline stage); with ``non_block``
          it returns a Future instead, so the caller can schedule the next step while this one runs.
        - Any worker failure surfaces as :class:`WorkerError` from the call that met it and from
          :meth:`check_health` afterwards; nothing hangs on a dead worker.
    """

    def __init__(self, config: EngineConfig, model_folder: Path) -> None:
        self.config = config
        self.model_folder = Path(model_folder)

    @abstractmethod
    def collective_rpc(self, method: str | Callable[..., Any], args: tuple = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        """Call ``Worker.<method>(*args, **kwargs)`` on every worker; results in rank order.

        ``method`` may also be a function (importable by module and name, to cross processes), called as
        ``method(worker, *args, **kwargs)``, as vLLM's ``collective_rpc`` allows.
        """

    @abstractmethod
    def execute_model(self, scheduler_output: SchedulerOutput,
                      non_block: bool = False) -> ModelRunnerOutput | Future[ModelRunnerOutput]:
        """Run one step on every worker; the output rank's output (or a Future of it)."""

    @abstractmethod
    def check_health(self) -> None:
        """Raise :class:`WorkerError` if any worker is gone or failed."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop the workers and release what they hold; safe to call twice."""

    def _execute_on_every_rank(self, scheduler_output: SchedulerOutput, non_block: bool,
                               pool: ThreadPoolExecutor) -> ModelRunnerOutput | Future[ModelRunnerOutput]:
        """``execute_model`` for workers outside this process: every rank runs the step and the output rank's
        output is returned, or a Future of it from ``pool`` (one thread, so steps stay in order)."""
        rank = self.config.parallel_config.output_rank
        if not non_block:
            return self.collective_rpc("execute_model", (scheduler_output,))[rank]
        return pool.submit(lambda: self.collective_rpc("execute_model", (scheduler_output,))[rank])

    def get_kv_cache_spec(self) -> dict[int, KVCacheSpec]:
        """Per attention layer, what it keeps per token on the workers that hold it (each pipeline stage holds
        its own layers; the TP ranks of a stage hold the same layers, each with its KV heads)."""
        specs: dict[int, KVCacheSpec] = {}
        for rank_specs in self.collective_rpc("get_kv_cache_spec"):
            specs.update(rank_specs)
        return dict(sorted(specs.items()))

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache that every worker can give: the smallest worker's."""
        return min(self.collective_rpc("determine_available_memory"))

    def kernel_fallbacks(self) -> dict[str, str]:
        """The C++ kernel libraries some worker failed to build, with what runs instead: a library missing on any
        rank slows every step."""
        fallbacks: dict[str, str] = {}
        for rank_fallbacks in self.collective_rpc("kernel_fallbacks"):
            fallbacks.update(rank_fallbacks)
        return fallbacks

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        self.collective_rpc("initialize_kv_cache", (kv_cache_config,))

    def capture_model(self, max_model_len: int) -> None:
        """Let every worker capture its decode steps in CUDA graphs, for requests of up to ``max_model_len`` tokens."""
        self.collective_rpc("capture_model", (max_model_len,))


def get_executor_class(backend: str) -> type[Executor]:
    """The executor class registered for a ``distributed_executor_backend`` name."""
    if backend not in _EXECUTORS:
        raise ValueError(f"unknown distributed_executor_backend {backend!r}; available: {sorted(_EXECUTORS)}")
    module_name, class_name = _EXECUTORS[backend]
    return getattr(importlib.import_module(module_name), class_name)


def call_worker(worker: Any, method: str | Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
    """Run one collective_rpc call on a worker: a method name, or a function taking the worker first."""
    if callable(method):
        return method(worker, *args, **kwargs)
    return getattr(worker, method)(*args, **kwargs)
