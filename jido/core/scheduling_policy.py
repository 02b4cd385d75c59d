"""Scheduling policies: the order in which waiting requests are admitted (fcfs, lpm, priority)."""
from __future__ import annotations

from collections import deque
from collections.abc import Callable

from jido.core.request import Request

# lpm: a request ranked behind later arrivals in this many scheduling passes goes first.
LPM_MAX_BYPASSES = 16


def order_waiting(waiting: deque[Request], policy: str, cached_len: Callable[[Request], int]) -> deque[Request]:
    """The waiting queue in admission order under ``policy``.

    - ``fcfs``: as it is (arrival order, preempted requests in front).
    - ``priority``: by vLLM's per-request ``priority`` (lower first), then arrival.
    - ``lpm`` (SGLang's longest prefix match): the longest cached prefix (``cached_len``, in tokens) first,
      ties by arrival; a request ranked behind later arrivals in ``LPM_MAX_BYPASSES`` passes goes before
      everyone, so a prompt with no cached prefix waits a bounded number of steps, not forever.
    """
    if policy == "fcfs" or len(waiting) < 2:
        return waiting
    if policy == "priority":
        return deque(sorted(waiting, key=lambda r: (r.priority, r.arrival_time)))
    ranked = sorted(waiting, key=lambda r: (r.num_bypasses < LPM_MAX_BYPASSES, -cached_len(r), r.arrival_time))
    for position, request in enumerate(ranked):
        if any(r.arrival_time > request.arrival_time for r in ranked[:position]):
            request.num_bypasses += 1
    return deque(ranked)


def preemption_victim(running: list[Request], policy: str) -> Request:
    """Who gives up its blocks when they run out: the newest, or under ``priority`` the least urgent."""
    if policy == "priority":
        return max(running, key=lambda r: (r.priority, r.arrival_time))
    return running[-1]
