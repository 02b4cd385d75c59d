"""UniprocExecutor: the worker runs in the engine's own process, on one device."""
from __future__ import annotations

import weakref
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from jido.config import EngineConfig
from jido.core.outputs import ModelRunnerOutput, SchedulerOutput
from jido.executor.abstract import Executor, call_worker
from jido.runner.worker import Worker


class UniprocExecutor(Executor):
    """Calls the worker directly: no copies, no processes."""

    def __init__(self, config: EngineConfig, model_folder: Path) -> None:
        super().__init__(config, model_folder)
        self.worker = Worker(config, self.model_folder)
        # An engine dropped without shutdown (``llm = LLM(...)`` rebound in a notebook) still hands its memory and
        # the process's allocator policy back when it is collected.
        self._finalizer = weakref.finalize(self, self.worker.shutdown)

    def collective_rpc(self, method: str | Callable[..., Any], args: tuple = (),
                       kwargs: dict[str, Any] | None = None) -> list[Any]:
        return [call_worker(self.worker, method, args, kwargs or {})]

    def execute_model(self, scheduler_output: SchedulerOutput,
                      non_block: bool = False) -> ModelRunnerOutput | Future[ModelRunnerOutput]:
        output = self.worker.execute_model(scheduler_output)
        if not non_block:
            return output
        future: Future[ModelRunnerOutput] = Future()
        future.set_result(output)
        return future

    def check_health(self) -> None:
        self.worker.check_health()

    def shutdown(self) -> None:
        """Stop the worker's background transfers and let go of its model and KV cache (the process lives on)."""
        self._finalizer()
