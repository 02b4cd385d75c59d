"""ParallelGroup: one torch.distributed process group (TP, PP or EP) and the collectives jido runs over it."""
from __future__ import annotations

import pickle
import time
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class CommStats:
    """What a group's collectives cost since the last reset: calls and bytes per operation, and seconds."""

    calls: Counter = field(default_factory=Counter)  # op name -> calls
    bytes: Counter = field(default_factory=Counter)  # op name -> bytes this rank sent into the op
    seconds: float = 0.0  # wall time inside the collectives (waiting on peers included)

    def add(self, op: str, num_bytes: int, seconds: float) -> None:
        self.calls[op] += 1
        self.bytes[op] += num_bytes
        self.seconds += seconds

    def as_dict(self) -> dict:
        return {"calls": dict(self.calls), "bytes": dict(self.bytes), "seconds": self.seconds}


class ParallelGroup:
    """The ranks of one parallel dimension and their collectives; a group of one makes every collective a no-op.

    ``ranks`` are global ranks in group order; ``rank_in_group`` is this process's index among them. Every
    collective is timed and counted in :attr:`stats` (the measurement of communication per step reads it).
    NOTE: every rank of a group must call the same collectives in the same order, or they deadlock.
    """

    def __init__(self, ranks: list[int], rank: int, group: dist.ProcessGroup | None) -> None:
        self.ranks = ranks
        self.rank = rank
        self.rank_in_group = ranks.index(rank)
        self.world_size = len(ranks)
        self.group = group
        self.stats = CommStats()

    @classmethod
    def single(cls) -> ParallelGroup:
        """The group of one process (no parallelism)."""
        return cls([0], 0, None)

    @property
    def is_first(self) -> bool:
        return self.rank_in_group == 0

    @property
    def is_last(self) -> bool:
        return self.rank_in_group == self.world_size - 1

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over the group, in place; returns ``x``."""
        if self.world_size == 1:
            return x
        start = time.perf_counter()
        dist.all_reduce(x, group=self.group)
        self.stats.add("all_reduce", x.numel() * x.element_size(), time.perf_counter() - start)
        return x

    def all_gather(self, x: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's ``x`` (all the same shape) concatenated along ``dim`` in group order."""
        if self.world_size == 1:
            return x
        start = time.perf_counter()
        parts = [torch.empty_like(x) for _ in range(self.world_size)]
        dist.all_gather(parts, x.contiguous(), group=self.group)
        self.stats.add("all_gather", x.numel() * x.element_size(), time.perf_counter() - start)
        return torch.cat(parts, dim=dim)

    def all_gather_rows(self, x: torch.Tensor, num_rows: list[int]) -> torch.Tensor:
        """Rows from every rank (rank ``i`` holds ``num_rows[i]`` of them) stacked in group order."""
        if self.world_size == 1:
            return x
        start = time.perf_counter()
        width = max(num_rows)
        padded = torch.zeros((width, *x.shape[1:]), dtype=x.dtype, device=x.device)
        padded[:x.shape[0]] = x
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded, group=self.group)
        self.stats.add("all_gather", padded.numel() * padded.element_size(), time.perf_counter() - start)
        return torch.cat([part[:n] for part, n in zip(parts, num_rows)])

    def all_to_all(self, x: torch.Tensor, send_rows: list[int], recv_rows: list[int]) -> torch.Tensor:
        """Send ``send_rows[i]`` consecutive rows of ``x`` to rank ``i``; returns the rows received, by sender."""
        if self.world_size == 1:
            return x
        start = time.perf_counter()
        out = torch.empty((sum(recv_rows), *x.shape[1:]), dtype=x.dtype, device=x.device)
        dist.all_to_all_single(out, x.contiguous(), recv_rows, send_rows, group=self.group)
        self.stats.add("all_to_all", x.numel() * x.element_size(), time.perf_counter() - start)
        return out

    def send(self, x: torch.Tensor, dst: int) -> dist.Work:
        """Start sending ``x`` to the group's rank ``dst``; wait on the returned handle before reusing ``x``."""
        start = time.perf_counter()
        work = dist.isend(x.contiguous(), self.ranks[dst], group=self.group)
        self.stats.add("send", x.numel() * x.element_size(), time.perf_counter() - start)
        return work

    def recv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int, device: torch.device) -> torch.Tensor:
        """A tensor of ``shape`` and ``dtype`` sent by the group's rank ``src``."""
        start = time.perf_counter()
        out = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(out, self.ranks[src], group=self.group)
        self.stats.add("recv", out.numel() * out.element_size(), time.perf_counter() - start)
        return out

    def broadcast_object(self, obj: object, src: int) -> object:
        """``obj`` of the group's rank ``src``, on every rank (pickled; for small host-side values)."""
        if self.world_size == 1:
            return obj
        start = time.perf_counter()
        holder = [obj if self.rank_in_group == src else None]
        dist.broadcast_object_list(holder, src=self.ranks[src], group=self.group)
        self.stats.add("broadcast", len(pickle.dumps(holder[0])), time.perf_counter() - start)
        return holder[0]
