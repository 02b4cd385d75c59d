"""Scheduler: token budget, chunked prefill, decodes first, prefix hits, preemption of the newest."""
from __future__ import annotations

from jido.core.kv_cache_manager import KVCacheManager
from jido.core.outputs import ModelRunnerOutput, PromptLogprobsLists, SchedulerOutput
from jido.core.request import Request, RequestStatus
from jido.core.sampling_params import SamplingParams
from jido.core.scheduler import Scheduler, SchedulerLimits


def make_scheduler(num_blocks=64, block_size=4, max_num_seqs=8, budget=64, max_model_len=256, caching=True):
    kv = KVCacheManager(num_blocks, block_size, caching)
    return Scheduler(SchedulerLimits(max_num_seqs, budget, max_model_len), kv)


def add(scheduler: Scheduler, req_id: str, num_tokens: int, max_tokens: int = 4, first: int = 0, **kw) -> Request:
    request = Request(req_id, list(range(first, first + num_tokens)), SamplingParams(max_tokens=max_tokens, **kw),
                      eos_token_ids=(1000,))
    scheduler.add_request(request)
    return request


def run_step(scheduler: Scheduler, token: int = 7) -> tuple[SchedulerOutput, list]:
    """Schedule, pretend the model sampled ``token`` for every request that reached its end."""
    out = scheduler.schedule()
    sampled = {}
    for req_id, n in out.num_scheduled_tokens.items():
        request = scheduler.requests[req_id]
        if request.num_computed_tokens + n == request.num_tokens:
            sampled[req_id] = [token]
    return out, scheduler.update_from_output(out, ModelRunnerOutput(sampled))


def test_long_prompt_is_prefilled_in_budget_sized_chunks():
    scheduler = make_scheduler(budget=16)
    request = add(scheduler, "a", 40)
    chunks = [run_step(scheduler)[0].num_scheduled_tokens["a"] for _ in range(3)]
    assert chunks == [16, 16, 8]
    assert request.output_token_ids == [7] and request.num_computed_tokens == 40


def test_decodes_are_scheduled_before_prefill_chunks_and_new_requests():
    scheduler = make_scheduler(budget=10)
    add(scheduler, "a", 4)
    run_step(scheduler)  # a prefilled, now decoding
    add(scheduler, "b", 30)
    out, _ = run_step(scheduler)
    assert out.num_scheduled_tokens == {"a": 1, "b": 9}
    out, _ = run_step(scheduler)
    assert list(out.num_scheduled_tokens.items()) == [("a", 1), ("b", 9)]


def test_prompt_chunks_beside_decodes_are_capped_so_a_long_prompt_barely_stalls_the_streams():
    kv = KVCacheManager(64, 4)
    scheduler = Scheduler(SchedulerLimits(8, 32, 256, max_num_prefill_tokens_while_decoding=6), kv)
    add(scheduler, "a", 4, max_tokens=20)
    add(scheduler, "b", 4, max_tokens=20, first=50)
    assert run_step(scheduler)[0].num_scheduled_tokens == {"a": 4, "b": 4}  # nothing decodes yet: no cap
    add(scheduler, "long", 40, first=100)
    add(scheduler, "short", 3, first=200)
    chunks = [run_step(scheduler)[0].num_scheduled_tokens for _ in range(3)]
    # 6 prompt tokens a step in all beside the decodes; "short" waits behind "long" (arrival order).
    assert chunks == [{"a": 1, "b": 1, "long": 6}] * 3
    scheduler.finish_requests(["a", "b"], RequestStatus.FINISHED_ABORTED)
    assert run_step(scheduler)[0].num_scheduled_tokens == {"long": 22, "short": 3}  # alone: the whole budget


def test_without_chunked_prefill_the_cap_beside_decodes_does_not_hold_a_prompt_back():
    kv = KVCacheManager(64, 4)
    limits = SchedulerLimits(8, 32, 32, enable_chunked_prefill=False, max_num_prefill_tokens_while_decoding=6)
    scheduler = Scheduler(limits, kv)
    add(scheduler, "a", 4, max_tokens=20)
    run_step(scheduler)
    add(scheduler, "whole", 20, first=100)
    assert run_step(scheduler)[0].num_scheduled_tokens == {"a": 1, "whole": 20}


def test_new_requests_are_sent_in_full_then_as_diffs():
    scheduler = make_scheduler()
    add(scheduler, "a", 6)
    out, _ = run_step(scheduler)
    assert [r.req_id for r in out.scheduled_new_reqs] == ["a"] and out.scheduled_new_reqs[0].block_ids == [[0, 1]]
    out, _ = run_step(scheduler)
    assert out.scheduled_new_reqs == [] and out.scheduled_cached_reqs[0].num_computed_tokens == 6
    assert out.scheduled_cached_reqs[0].new_block_ids == [[]]


def test_max_num_seqs_bounds_the_running_set():
    scheduler = make_scheduler(max_num_seqs=2)
    for name in "abc":
        add(scheduler, name, 4)
    out, _ = run_step(scheduler)
    assert set(out.num_scheduled_tokens) == {"a", "b"} and len(scheduler.waiting) == 1


def test_prefix_hit_skips_cached_tokens_and_is_recorded():
    scheduler = make_scheduler()
    add(scheduler, "a", 12, max_tokens=1)
    run_step(scheduler)
    b = add(scheduler, "b", 14, max_tokens=1)
    out, _ = run_step(scheduler)
    assert out.num_scheduled_tokens == {"b": 2}
    assert b.num_cached_tokens == 12 and out.scheduled_new_reqs[0].num_computed_tokens == 12


def test_request_owing_prompt_logprobs_computes_its_whole_prompt_but_still_fills_the_cache():
    scheduler = make_scheduler()
    add(scheduler, "a", 12, max_tokens=1)
    run_step(scheduler)
    b = add(scheduler, "b", 14, max_tokens=1, prompt_logprobs=1)
    out, _ = run_step(scheduler)
    assert out.num_scheduled_tokens == {"b": 14} and out.scheduled_new_reqs[0].num_computed_tokens == 0
    assert b.num_cached_tokens == 0 and scheduler.kv.prefix_cache_queries == 12  # b's lookup was not made
    c = add(scheduler, "c", 14, max_tokens=1)
    run_step(scheduler)
    assert c.num_cached_tokens == 12


def test_preempted_request_that_sent_its_prompt_logprobs_may_resume_from_the_cache():
    scheduler = make_scheduler()
    a = add(scheduler, "a", 12, max_tokens=5, prompt_logprobs=0)
    run_step(scheduler)
    scheduler._preempt(a)
    out, _ = run_step(scheduler)
    assert out.scheduled_new_reqs[0].num_computed_tokens == 12 and out.num_scheduled_tokens == {"a": 1}


def test_max_tokens_zero_finishes_after_the_prompt_with_no_token_and_its_prompt_logprobs():
    scheduler = make_scheduler(budget=8)
    a = add(scheduler, "a", 12, max_tokens=0, prompt_logprobs=1)
    out = scheduler.schedule()
    assert scheduler.update_from_output(out, ModelRunnerOutput({})) == []  # a chunk inside the prompt
    out = scheduler.schedule()
    scores = PromptLogprobsLists([-1.0] * 11, [1] * 11, [[5]] * 11, [[-0.5]] * 11)
    (output,) = scheduler.update_from_output(out, ModelRunnerOutput({"a": [7]}, prompt_logprobs={"a": scores}))
    assert (output.new_token_ids, output.finish_reason, output.prompt_logprobs) == ([], "length", scores)
    assert a.output_token_ids == [] and a.status == RequestStatus.FINISHED_LENGTH and scheduler.kv.usage == 0.0
    assert scheduler.schedule().finished_req_ids == {"a"}


def test_stop_conditions_finish_requests_and_free_blocks():
    scheduler = make_scheduler()
    add(scheduler, "eos", 4, max_tokens=10)
    add(scheduler, "len", 4, max_tokens=1, first=50, ignore_eos=True)
    _, outputs = run_step(scheduler, token=1000)
    reasons = {o.req_id: o.finish_reason for o in outputs}
    assert reasons == {"eos": "stop", "len": "length"}
    assert scheduler.kv.usage == 0.0 and not scheduler.has_unfinished_requests()
    assert scheduler.schedule().finished_req_ids == {"eos", "len"}


def test_min_tokens_and_ignore_eos_defer_the_eos_stop():
    scheduler = make_scheduler()
    add(scheduler, "a", 4, max_tokens=5, min_tokens=2)
    add(scheduler, "b", 4, max_tokens=2, ignore_eos=True, first=50)
    _, outputs = run_step(scheduler, token=1000)
    assert all(o.finish_reason is None for o in outputs)
    _, outputs = run_step(scheduler, token=1000)
    assert {o.req_id: o.finish_reason for o in outputs} == {"a": "stop", "b": "length"}


def test_stop_token_ids_record_the_stop_reason():
    scheduler = make_scheduler()
    add(scheduler, "a", 4, max_tokens=5, stop_token_ids=[7])
    _, outputs = run_step(scheduler, token=7)
    assert outputs[0].finish_reason == "stop" and outputs[0].stop_reason == 7


def test_max_model_len_ends_generation():
    scheduler = make_scheduler(max_model_len=6)
    add(scheduler, "a", 4, max_tokens=100)
    run_step(scheduler)
    _, outputs = run_step(scheduler)
    assert outputs[0].finish_reason == "length"


def test_newest_running_request_is_preempted_when_blocks_run_out():
    scheduler = make_scheduler(num_blocks=4, block_size=4)
    a = add(scheduler, "a", 8, max_tokens=20)
    b = add(scheduler, "b", 7, max_tokens=20, first=100)
    run_step(scheduler)  # a: 2 blocks, b: 2 blocks (8 tokens with its first output)
    out, _ = run_step(scheduler)  # a needs a third block: b, the newest, is preempted
    assert b.status == RequestStatus.PREEMPTED
    assert out.num_scheduled_tokens == {"a": 1} and out.finished_req_ids == {"b"}
    assert scheduler.num_preemptions == 1 and b.num_computed_tokens == 0 and b.output_token_ids == [7]
    assert scheduler.waiting[0] is b
    out, _ = run_step(scheduler)
    assert "b" not in out.num_scheduled_tokens and a.num_output_tokens == 3


def test_preempted_request_resumes_with_its_tokens_and_finishes():
    scheduler = make_scheduler(num_blocks=5, block_size=4)
    a = add(scheduler, "a", 8, max_tokens=6)
    b = add(scheduler, "b", 7, max_tokens=6, first=100)
    resumed = None
    for _ in range(30):
        out, _ = run_step(scheduler)
        for new in out.scheduled_new_reqs:
            if new.req_id == "b" and b.num_preemptions:
                resumed = new
        if not scheduler.has_unfinished_requests():
            break
    assert scheduler.num_preemptions >= 1
    assert resumed is not None and resumed.token_ids[:7] == list(range(100, 107)) and len(resumed.token_ids) > 7
    assert a.num_output_tokens == 6 and b.num_output_tokens == 6
    assert a.status == RequestStatus.FINISHED_LENGTH and b.status == RequestStatus.FINISHED_LENGTH


def test_abort_frees_blocks_and_tells_the_runner():
    scheduler = make_scheduler()
    add(scheduler, "a", 10, max_tokens=50)
    run_step(scheduler)
    assert scheduler.kv.usage > 0
    scheduler.finish_requests(["a"], RequestStatus.FINISHED_ABORTED)
    assert scheduler.kv.usage == 0.0
    assert scheduler.schedule().finished_req_ids == {"a"}


def test_proposed_tokens_are_scheduled_and_rejected_ones_rolled_back():
    scheduler = make_scheduler()
    request = add(scheduler, "a", 6, max_tokens=20)
    run_step(scheduler)  # prefill: computed 6, one output token (7)
    request.spec_token_ids = [11, 12, 13]
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"a": 4} and out.scheduled_spec_decode_tokens == {"a": [11, 12, 13]}
    # The runner accepted 11 and replaced 12 by 21: two tokens; 12 and 13 are taken back.
    outputs = scheduler.update_from_output(out, ModelRunnerOutput({"a": [11, 21]}))
    assert outputs[0].new_token_ids == [11, 21]
    assert request.output_token_ids == [7, 11, 21] and request.num_computed_tokens == 8
    assert request.spec_token_ids == []
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"a": 1} and out.scheduled_spec_decode_tokens == {}


def test_a_stop_inside_an_accepted_run_ends_the_request_there():
    scheduler = make_scheduler()
    request = add(scheduler, "a", 6, max_tokens=20, stop_token_ids=[12])
    run_step(scheduler)
    request.spec_token_ids = [11, 12, 13]
    out = scheduler.schedule()
    outputs = scheduler.update_from_output(out, ModelRunnerOutput({"a": [11, 12, 13, 14]}))
    assert outputs[0].new_token_ids == [11, 12] and outputs[0].finish_reason == "stop"
    assert outputs[0].stop_reason == 12 and request.output_token_ids == [7, 11, 12]
    assert "a" in scheduler.schedule().finished_req_ids


def test_lookahead_slots_are_allocated_past_the_known_tokens():
    scheduler = Scheduler(SchedulerLimits(8, 64, 256, num_lookahead_tokens=4), KVCacheManager(64, 4))
    add(scheduler, "a", 4)
    out = scheduler.schedule()
    # 4 prompt tokens + 4 lookahead slots = 2 blocks of 4.
    assert out.scheduled_new_reqs[0].block_ids == [[0, 1]]
