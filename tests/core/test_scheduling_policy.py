"""Scheduling policies: lpm admits the longest cached prefix first and starves no one; priority orders admission
and preempts the least urgent."""
from __future__ import annotations

from jido.core.kv_cache_manager import KVCacheManager
from jido.core.outputs import ModelRunnerOutput
from jido.core.request import Request, RequestStatus
from jido.core.sampling_params import SamplingParams
from jido.core.scheduler import Scheduler, SchedulerLimits
from jido.core.scheduling_policy import LPM_MAX_BYPASSES


def make(policy: str, max_num_seqs: int = 1, num_blocks: int = 64) -> Scheduler:
    return Scheduler(SchedulerLimits(max_num_seqs, 64, 256, policy=policy), KVCacheManager(num_blocks, 4))


def add(scheduler: Scheduler, req_id: str, tokens: list[int], priority: int = 0, arrival: float = 0.0) -> Request:
    request = Request(req_id, tokens, SamplingParams(max_tokens=1), arrival_time=arrival, priority=priority)
    scheduler.add_request(request)
    return request


def drain(scheduler: Scheduler) -> list[str]:
    """Run to the end; the order in which requests were first scheduled."""
    order = []
    while scheduler.has_unfinished_requests():
        out = scheduler.schedule()
        order += [r.req_id for r in out.scheduled_new_reqs]
        sampled = {r: [7] for r in out.num_scheduled_tokens}
        scheduler.update_from_output(out, ModelRunnerOutput(sampled))
    return order


def test_lpm_admits_the_longest_cached_prefix_first_and_fcfs_in_arrival_order():
    shared = list(range(100, 116))  # four blocks of 4
    for policy, expected in (("fcfs", ["warm", "cold", "half", "full"]), ("lpm", ["warm", "full", "half", "cold"])):
        scheduler = make(policy)
        add(scheduler, "warm", shared + [1], arrival=0)
        drain(scheduler)
        add(scheduler, "cold", list(range(200, 217)), arrival=1)
        add(scheduler, "half", shared[:8] + list(range(300, 309)), arrival=2)
        add(scheduler, "full", shared + [2], arrival=3)
        assert ["warm", *drain(scheduler)] == expected, policy


def test_lpm_lets_a_request_with_no_cached_prefix_go_first_after_a_bounded_wait():
    scheduler = make("lpm")
    shared = list(range(100, 116))
    add(scheduler, "warm", shared + [1], arrival=0)
    drain(scheduler)
    add(scheduler, "cold", list(range(200, 217)), arrival=1)
    for i in range(LPM_MAX_BYPASSES + 4):
        add(scheduler, f"hot{i}", shared + [10 + i], arrival=2 + i)
    order = drain(scheduler)
    assert order.index("cold") == LPM_MAX_BYPASSES  # overtaken in 16 passes, then first


def test_priority_admits_lower_values_first_then_by_arrival():
    scheduler = make("priority")
    for i, (name, priority) in enumerate([("c", 5), ("a", 0), ("b", 5), ("urgent", -1)]):
        add(scheduler, name, list(range(10 * i, 10 * i + 6)), priority=priority, arrival=i)
    assert drain(scheduler) == ["urgent", "a", "c", "b"]


def test_priority_preempts_the_least_urgent_running_request():
    scheduler = make("priority", max_num_seqs=3, num_blocks=6)
    low = add(scheduler, "low", list(range(8)), priority=9, arrival=0)
    high = add(scheduler, "high", list(range(20, 28)), priority=0, arrival=1)
    low.sampling_params = high.sampling_params = SamplingParams(max_tokens=20)
    for _ in range(6):
        out = scheduler.schedule()
        scheduler.update_from_output(out, ModelRunnerOutput({r: [7] for r in out.num_scheduled_tokens}))
    # Six blocks hold 24 tokens: when both outgrow them, the later but more urgent one keeps running.
    assert low.status == RequestStatus.PREEMPTED and high.status == RequestStatus.RUNNING
