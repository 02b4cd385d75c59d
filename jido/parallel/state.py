"""ModelParallel: this process's tensor, pipeline and expert groups; the rendezvous that makes them; the scope
in which a model is built for them."""
from __future__ import annotations

import datetime
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.distributed as dist

from jido.parallel.group import ParallelGroup

logger = logging.getLogger("jido")


class RendezvousError(RuntimeError):
    """A rank could not join its process group (the address is unreachable, or peers never came)."""


@dataclass(frozen=True)
class ModelParallel:
    """The groups one rank belongs to. Global rank = ``pp_rank * tp_size + tp_rank``.

    ``tp``: the ranks that split each layer (one pipeline stage); ``pp``: the ranks that hold the same TP
    shard of successive stages; ``ep``: the ranks that split the experts, the TP group when expert
    parallelism is on, else this rank alone (each rank then holds a TP slice of every expert).
    """

    rank: int
    world_size: int
    tp: ParallelGroup
    pp: ParallelGroup
    ep: ParallelGroup

    @classmethod
    def single(cls) -> ModelParallel:
        one = ParallelGroup.single()
        return cls(0, 1, one, one, one)

    @property
    def groups(self) -> dict[str, ParallelGroup]:
        return {"tp": self.tp, "pp": self.pp, "ep": self.ep}


def init_model_parallel(rank: int, tp_size: int, pp_size: int, enable_expert_parallel: bool, init_method: str,
                        timeout_s: float, device: torch.device) -> ModelParallel:
    """Join the process group at ``init_method`` (``tcp://host:port``; rank 0 listens there) and make the groups.

    gloo on CPU, NCCL on CUDA.

    Raises:
        RendezvousError: the group did not form within ``timeout_s``; the message names this rank and the address.
    """
    world_size = tp_size * pp_size
    backend = "nccl" if device.type == "cuda" else "gloo"
    try:
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    except (RuntimeError, ValueError, OSError) as exc:  # DistStoreError is a RuntimeError
        raise RendezvousError(f"rank {rank} of {world_size} could not join the process group at {init_method} "
                              f"({backend}) within {timeout_s:g} s: {exc}") from None
    tp_rank, pp_rank = rank % tp_size, rank // tp_size
    tp_ranks = [pp_rank * tp_size + i for i in range(tp_size)]
    pp_ranks = [stage * tp_size + tp_rank for stage in range(pp_size)]
    tp = _group(rank, tp_ranks, [[s * tp_size + i for i in range(tp_size)] for s in range(pp_size)])
    pp = _group(rank, pp_ranks, [[s * tp_size + t for s in range(pp_size)] for t in range(tp_size)])
    ep = tp if enable_expert_parallel else ParallelGroup([rank], rank, None)
    logger.info("rank %d of %d joined %s: TP rank %d of %d, PP stage %d of %d%s", rank, world_size, init_method,
                tp_rank, tp_size, pp_rank, pp_size, ", experts split over the TP group" if enable_expert_parallel
                else "")
    return ModelParallel(rank, world_size, tp, pp, ep)


def _group(rank: int, mine: list[int], every: list[list[int]]) -> ParallelGroup:
    # NOTE: new_group must be called by every rank for every group, in the same order, even for groups it is
    # not in; a group of one needs no process group.
    handle = None
    for ranks in every:
        group = dist.new_group(ranks) if len(ranks) > 1 else None
        if ranks == mine:
            handle = group
    return ParallelGroup(mine, rank, handle)


def destroy_model_parallel() -> None:
    """Leave the process group (safe when none was joined)."""
    if dist.is_initialized():
        dist.destroy_process_group()


_current: ModelParallel | None = None


@contextmanager
def building_for(parallel: ModelParallel) -> Iterator[None]:
    """Build a model for ``parallel`` inside this block: its layers read their groups from :func:`current`.

    Layers take their group when constructed and keep it, so the scope is needed only while building. It
    refuses nesting: two models built for different groups at once would be a bug.
    """
    global _current
    if _current is not None:
        raise RuntimeError("building_for() does not nest: a model is already being built for other groups")
    _current = parallel
    try:
        yield
    finally:
        _current = None


def current() -> ModelParallel:
    """The groups of the model being built (inside :func:`building_for`), else those of a single process."""
    return _current or ModelParallel.single()


def layer_range(num_layers: int, pp: ParallelGroup) -> tuple[int, int]:
    """The layers ``[start, end)`` of this pipeline stage: an even split, the first stages taking any remainder.

    Raises:
        ValueError: fewer layers than stages.
    """
    if num_layers < pp.world_size:
        raise ValueError(f"pipeline_parallel_size={pp.world_size} needs at least as many layers; the model has "
                         f"{num_layers}")
    base, extra = divmod(num_layers, pp.world_size)
    stage = pp.rank_in_group
    start = stage * base + min(stage, extra)
    return start, start + base + (stage < extra)


def local_kv_heads(num_kv_heads: int, tp_size: int) -> int:
    """KV heads each TP rank holds: its share, or one (replicated) when there are fewer heads than ranks."""
    return max(1, num_kv_heads // tp_size)
