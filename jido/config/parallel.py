"""ParallelConfig: how many workers run the model and which executor drives them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from jido.config.size import check_positive_int

ExecutorBackend = Literal["uni", "mp"]
EXECUTOR_BACKENDS: tuple[str, ...] = get_args(ExecutorBackend)


@dataclass(frozen=True)
class ParallelConfig:
    """Workers and the executor that drives them (vLLM's names).

    Tensor and pipeline parallelism arrive with the parallelism issue; until then a size above 1 is
    refused here, at the edge, rather than ignored.
    """

    tensor_parallel_size: int = 1
    """Workers that split each layer (only 1 for now)."""
    pipeline_parallel_size: int = 1
    """Workers that split the layers into stages (only 1 for now)."""
    distributed_executor_backend: ExecutorBackend = "uni"
    """uni runs the model in the engine's process; mp in worker processes sent each step over a pipe."""

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size"):
            check_positive_int(name, getattr(self, name))
            if getattr(self, name) != 1:
                raise ValueError(f"{name}={getattr(self, name)} is not supported yet: jido runs one worker")
        if self.distributed_executor_backend not in EXECUTOR_BACKENDS:
            raise ValueError(f"distributed_executor_backend must be one of {', '.join(EXECUTOR_BACKENDS)}, "
                             f"got {self.distributed_executor_backend!r}")

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size
