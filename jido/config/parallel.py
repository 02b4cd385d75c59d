"""ParallelConfig: how the model is split over workers (TP, PP, EP), how many replicas serve (DP), and which
executor drives the workers."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from jido.config.size import check_positive_int

ExecutorBackend = Literal["uni", "mp", "ray"]
EXECUTOR_BACKENDS: tuple[str, ...] = get_args(ExecutorBackend)
DataParallelRouting = Literal["cache_aware", "round_robin"]


@dataclass(frozen=True)
class ParallelConfig:
    """Workers, replicas and the executor that drives the workers (vLLM's names)."""

    tensor_parallel_size: int = 1
    """Workers that split each layer: attention by heads, the MLP by columns, the vocabulary by rows."""
    pipeline_parallel_size: int = 1
    """Workers that split the layers into stages; hidden states pass from stage to stage."""
    pipeline_micro_batches: int | None = None
    """Micro-batches a step's requests are split into so that pipeline stages overlap (default: one per stage)."""
    data_parallel_size: int = 1
    """Engine replicas behind one server, each with its own workers and KV cache (jido serve only)."""
    data_parallel_routing: DataParallelRouting = "cache_aware"
    """How the server picks a replica: cache_aware (the replica holding the longest prefix of the prompt, unless
    loads are uneven) or round_robin."""
    enable_expert_parallel: bool = False
    """Split a mixture-of-experts model's experts over the tensor-parallel ranks (tokens travel by all-to-all)
    instead of splitting every expert."""
    distributed_executor_backend: ExecutorBackend | None = None
    """uni runs the model in the engine's process; mp in worker processes on this machine sent each step over a
    pipe; ray in Ray actors placed on a Ray cluster (default: uni for one worker, else mp; jido serve: mp)."""
    distributed_timeout_seconds: float = 120.0
    """How long workers wait for each other to form the process group at start."""

    def __post_init__(self) -> None:
        for name in ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size"):
            check_positive_int(name, getattr(self, name))
        if self.pipeline_micro_batches is not None:
            check_positive_int("pipeline_micro_batches", self.pipeline_micro_batches)
        backend = self.distributed_executor_backend
        if backend is not None and backend not in EXECUTOR_BACKENDS:
            raise ValueError(f"distributed_executor_backend must be one of {', '.join(EXECUTOR_BACKENDS)}, "
                             f"got {backend!r}")
        if backend == "uni" and self.world_size > 1:
            raise ValueError(f"tensor_parallel_size * pipeline_parallel_size = {self.world_size} workers need "
                             "distributed_executor_backend mp or ray; uni runs one worker in the engine's process")
        if self.data_parallel_routing not in get_args(DataParallelRouting):
            raise ValueError(f"data_parallel_routing must be one of {', '.join(get_args(DataParallelRouting))}, "
                             f"got {self.data_parallel_routing!r}")
        if not isinstance(self.distributed_timeout_seconds, (int, float)) or self.distributed_timeout_seconds <= 0:
            raise ValueError(f"distributed_timeout_seconds must be a positive number, "
                             f"got {self.distributed_timeout_seconds!r}")

    @property
    def world_size(self) -> int:
        """Workers of one replica."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def executor_backend(self) -> str:
        """The executor to use: as asked, else ``uni`` for one worker of one replica and ``mp`` otherwise (as vLLM;
        data-parallel replicas in one process would share its torch threads)."""
        alone = self.world_size == 1 and self.data_parallel_size == 1
        return self.distributed_executor_backend or ("uni" if alone else "mp")

    @property
    def output_rank(self) -> int:
        """The worker whose step output the engine reads: the first TP rank of the last pipeline stage."""
        return (self.pipeline_parallel_size - 1) * self.tensor_parallel_size

    @property
    def num_micro_batches(self) -> int:
        return self.pipeline_micro_batches or self.pipeline_parallel_size
