"""Batching modes in the scheduler: continuous refills slots, static and dynamic run batches to completion."""
from __future__ import annotations

import time

import pytest

from jido.core.kv_cache_manager import KVCacheManager
from jido.core.request import Request
from jido.core.sampling_params import SamplingParams
from jido.core.scheduler import Scheduler, SchedulerLimits
from test_scheduler import run_step


def make_scheduler(mode: str, max_num_seqs: int = 2, num_blocks: int = 64, max_wait_s: float = 60.0,
                   budget: int = 64, chunked: bool = True, policy: str = "fcfs") -> Scheduler:
    limits = SchedulerLimits(max_num_seqs, budget, 256, policy=policy, enable_chunked_prefill=chunked,
                             scheduling_mode=mode, max_batch_wait_s=max_wait_s)
    return Scheduler(limits, KVCacheManager(num_blocks, 4, True))


def add(scheduler: Scheduler, req_id: str, num_tokens: int = 4, max_tokens: int = 2, first: int = 0,
        waited_s: float = 0.0, priority: int = 0) -> Request:
    request = Request(req_id, list(range(first, first + num_tokens)), SamplingParams(max_tokens=max_tokens),
                      arrival_time=time.monotonic() - waited_s, priority=priority)
    scheduler.add_request(request)
    return request


def scheduled_sets(scheduler: Scheduler, max_steps: int = 40) -> list[set[str]]:
    """Who computed in each step until every request finished."""
    steps = []
    while scheduler.has_unfinished_requests() and len(steps) < max_steps:
        steps.append(set(run_step(scheduler)[0].num_scheduled_tokens))
    return steps


def test_continuous_gives_a_finished_requests_slot_to_the_next_one_at_once():
    scheduler = make_scheduler("continuous")
    add(scheduler, "a", max_tokens=1), add(scheduler, "b", max_tokens=3), add(scheduler, "c", max_tokens=1)
    assert scheduled_sets(scheduler) == [{"a", "b"}, {"b", "c"}, {"b"}]


def test_static_admits_no_one_until_its_whole_batch_has_finished():
    scheduler = make_scheduler("static")
    add(scheduler, "a", max_tokens=1), add(scheduler, "b", max_tokens=3), add(scheduler, "c", max_tokens=1)
    assert scheduled_sets(scheduler) == [{"a", "b"}, {"b"}, {"b"}, {"c"}]


def test_static_runs_a_part_full_batch_without_waiting():
    scheduler = make_scheduler("static", max_num_seqs=4)
    add(scheduler, "a", max_tokens=1)
    assert scheduler.stats().admission_wait_s == 0
    assert scheduled_sets(scheduler) == [{"a"}]


def test_dynamic_waits_for_a_full_batch_then_runs_it_to_completion():
    scheduler = make_scheduler("dynamic", max_wait_s=60.0)
    add(scheduler, "a", max_tokens=1)
    out, _ = run_step(scheduler)
    assert out.num_scheduled_tokens == {} and 59 < scheduler.stats().admission_wait_s <= 60
    add(scheduler, "b", max_tokens=3), add(scheduler, "c", max_tokens=1)
    assert scheduler.stats().admission_wait_s == 0  # two wait: the batch is full
    assert scheduled_sets(scheduler, max_steps=3) == [{"a", "b"}, {"b"}, {"b"}]
    assert 59 < scheduler.stats().admission_wait_s <= 60  # c alone waits for company again


def test_dynamic_runs_a_part_full_batch_once_its_oldest_request_waited_max_wait():
    scheduler = make_scheduler("dynamic", max_num_seqs=4, max_wait_s=0.5)
    add(scheduler, "a", max_tokens=1, waited_s=0.2)
    wait_s = scheduler.stats().admission_wait_s
    assert 0.25 < wait_s <= 0.3
    add(scheduler, "b", max_tokens=1, waited_s=0.6)
    assert scheduler.stats().admission_wait_s == 0
    assert scheduled_sets(scheduler) == [{"a", "b"}]


def test_the_policy_chooses_who_fills_a_static_batch_and_the_mode_how_many():
    scheduler = make_scheduler("static", policy="priority")
    add(scheduler, "a", max_tokens=1, priority=5), add(scheduler, "b", max_tokens=3, priority=1)
    add(scheduler, "c", max_tokens=1, priority=0)
    run_step(scheduler)
    add(scheduler, "d", max_tokens=1, priority=-1)  # more urgent than a, but the batch {b, c} is closed
    assert scheduled_sets(scheduler) == [{"b"}, {"b"}, {"a", "d"}]
    scheduler = make_scheduler("continuous", policy="priority")
    for name, priority in (("a", 5), ("b", 1), ("c", 0)):
        add(scheduler, name, max_tokens=1 if name != "b" else 3, priority=priority)
    run_step(scheduler)
    add(scheduler, "d", max_tokens=1, priority=-1)
    assert scheduled_sets(scheduler) == [{"b", "d"}, {"b", "a"}]


def test_a_preempted_member_of_a_static_batch_gets_its_seat_back_before_any_newcomer():
    # 4 blocks of 4 tokens: a and b take two each; a's third block preempts b, which must come back
    # (when a has finished and freed its blocks) before c, who arrived during the batch.
    scheduler = make_scheduler("static", num_blocks=4)
    a = add(scheduler, "a", 8, max_tokens=6)
    b = add(scheduler, "b", 7, max_tokens=2, first=100)
    run_step(scheduler)
    add(scheduler, "c", 4, max_tokens=1, first=200)
    steps = scheduled_sets(scheduler)
    assert b.num_preemptions == 1 and a.num_preemptions == 0
    assert steps[0] == {"a"}  # b was preempted for a's block
    first_b = next(i for i, s in enumerate(steps) if "b" in s)
    first_c = next(i for i, s in enumerate(steps) if "c" in s)
    assert all(s == {"a"} for s in steps[:first_b]) and first_b < first_c
    assert all(s == {"b"} for s in steps[first_b:first_c])


def test_without_chunked_prefill_a_prompt_waits_until_it_fits_the_budget_whole():
    chunked, whole = (make_scheduler("continuous", budget=16, chunked=c) for c in (True, False))
    for scheduler in (chunked, whole):
        add(scheduler, "a", 10, max_tokens=2), add(scheduler, "b", 10, max_tokens=2, first=50)
    assert run_step(chunked)[0].num_scheduled_tokens == {"a": 10, "b": 6}
    assert run_step(whole)[0].num_scheduled_tokens == {"a": 10}
    assert run_step(whole)[0].num_scheduled_tokens == {"a": 1, "b": 10}


def test_an_unknown_scheduling_mode_is_refused():
    with pytest.raises(ValueError, match="scheduling_mode must be one of continuous, dynamic, static, got 'x'"):
        make_scheduler("x")
