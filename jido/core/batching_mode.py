"""Batching modes: how many waiting requests the scheduler may admit in a step (continuous, dynamic, static)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from jido.core.request import Request


class BatchingMode(Protocol):
    """The admission rule the scheduler consults once per step, after its policy has ordered the queue.

    The mode says how many of the waiting queue's first requests may start; the token budget,
    ``max_num_seqs`` and free blocks bound that further, so the scheduler reports each start it makes.
    The policy decides who is first; the mode only decides how many and when, so any policy composes
    with any mode.
    """

    def num_admissible(self, num_running: int, waiting: Sequence[Request], now: float) -> int:
        """How many waiting requests may start this step (may change the mode's state: a batch forms).

        Args:
            num_running: requests running now, after this step's running requests were served.
            waiting: the waiting queue in the policy's order (not modified).
            now: ``time.monotonic()``, the clock of ``Request.arrival_time``.
        """
        ...

    def admitted(self) -> None:
        """One of the admissible requests started."""
        ...

    def preempted(self) -> None:
        """A running request went back to the waiting queue."""
        ...

    def wait_s(self, num_running: int, waiting: Sequence[Request], now: float) -> float:
        """Seconds the mode will hold back requests that wait while nothing runs, unless more arrive; 0 when
        it holds none back. An engine with nothing else to do may sleep this long instead of stepping."""
        ...


class ContinuousBatching:
    """Admit whenever a slot is free: a finished request's place is taken in the next step."""

    def __init__(self, max_num_seqs: int) -> None:
        self.max_num_seqs = max_num_seqs

    def num_admissible(self, num_running: int, waiting: Sequence[Request], now: float) -> int:
        return self.max_num_seqs - num_running

    def admitted(self) -> None:
        pass

    def preempted(self) -> None:
        pass

    def wait_s(self, num_running: int, waiting: Sequence[Request], now: float) -> float:
        return 0.0


class BatchToCompletion:
    """Form a batch of up to ``max_num_seqs`` waiting requests, admit no other until all of it has finished.

    Static batching (``max_wait_s=None``) forms the batch from whatever waits once the last one ended;
    dynamic batching holds it back until ``max_num_seqs`` requests wait or the oldest has waited
    ``max_wait_s``. A member the token budget or the blocks keep waiting joins in a later step; a preempted
    member gives its seat back, so it (or whoever the policy puts first) is admitted again.
    """

    def __init__(self, max_num_seqs: int, max_wait_s: float | None) -> None:
        self.max_num_seqs = max_num_seqs
        self.max_wait_s = max_wait_s
        self._seats = 0  # members of the current batch still to be admitted

    def num_admissible(self, num_running: int, waiting: Sequence[Request], now: float) -> int:
        if num_running == 0 and (self._seats == 0 or not waiting):
            # The last batch is done (or its members not yet admitted were aborted): form the next one.
            self._seats = min(len(waiting), self.max_num_seqs) if self._ready(waiting, now) else 0
        return self._seats

    def admitted(self) -> None:
        self._seats -= 1

    def preempted(self) -> None:
        self._seats += 1

    def wait_s(self, num_running: int, waiting: Sequence[Request], now: float) -> float:
        if num_running or self._seats or not waiting or self._ready(waiting, now):
            return 0.0
        return _oldest_arrival(waiting) + self.max_wait_s - now

    def _ready(self, waiting: Sequence[Request], now: float) -> bool:
        if not waiting:
            return False
        if self.max_wait_s is None or len(waiting) >= self.max_num_seqs:
            return True
        return now - _oldest_arrival(waiting) >= self.max_wait_s


def _oldest_arrival(waiting: Sequence[Request]) -> float:
    return min(request.arrival_time for request in waiting)


def make_batching_mode(mode: str, max_num_seqs: int, max_batch_wait_s: float) -> BatchingMode:
    """The batching mode ``SchedulerConfig.scheduling_mode`` names."""
    if mode == "continuous":
        return ContinuousBatching(max_num_seqs)
    if mode == "dynamic":
        return BatchToCompletion(max_num_seqs, max_batch_wait_s)
    if mode == "static":
        return BatchToCompletion(max_num_seqs, None)
    raise ValueError(f"scheduling_mode must be one of continuous, dynamic, static, got {mode!r}")
