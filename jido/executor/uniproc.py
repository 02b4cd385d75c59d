"""UniprocExecutor: runs the model runner in the engine's own process, on one device."""
from __future__ import annotations

from jido.config import EngineConfig
from jido.core.outputs import ModelRunnerOutput, SchedulerOutput
from jido.runner.model_runner import ModelRunner


class UniprocExecutor:
    """The executor seam: the engine core hands it one SchedulerOutput per step.

    Multi-process and multi-node executors implement the same two methods, sending the (picklable)
    SchedulerOutput to their workers instead of calling the runner directly.
    """

    def __init__(self, config: EngineConfig) -> None:
        self.runner = ModelRunner(config)

    def initialize_kv_cache(self, num_blocks: int) -> None:
        self.runner.initialize_kv_cache(num_blocks)

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.runner.execute_model(scheduler_output)
