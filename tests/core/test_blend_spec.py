"""CacheBlend's scheduler side: a blend request's chunks found in the prefix cache, held for its one prefill step and
released after, and its blended blocks never offered to the prefix cache."""
from __future__ import annotations

import pytest

from jido.core.kv_blend import BlendChunk, BlendSpec
from jido.core.kv_cache_manager import KVCacheManager
from jido.core.outputs import ModelRunnerOutput
from jido.core.request import Request
from jido.core.sampling_params import SamplingParams
from jido.core.scheduler import Scheduler, SchedulerLimits

HEAD, DOC_A, DOC_B, QUESTION = [1], list(range(10, 19)), list(range(30, 41)), [5, 6]  # documents of 9 and 11


def make(budget: int = 64, sliding_windows: tuple[int | None, ...] = (None,)) -> Scheduler:
    return Scheduler(SchedulerLimits(8, budget, 256), KVCacheManager(40, 4, sliding_windows=sliding_windows))


def run(scheduler: Scheduler, request: Request) -> None:
    """Add a request and step it to the end, one token per step."""
    scheduler.add_request(request)
    while request.request_id in scheduler.requests:
        out = scheduler.schedule()
        scheduler.update_from_output(out, ModelRunnerOutput({r: [7] for r in out.num_scheduled_tokens}))


def blend_request(ratio: float = 0.15) -> Request:
    spec = BlendSpec(len(HEAD), (10, 21), ratio)
    return Request("blend", HEAD + DOC_A + DOC_B + QUESTION, SamplingParams(max_tokens=2), kv_blend=spec)


def test_the_spec_names_each_chunks_span_and_its_standalone_prompt():
    request = blend_request()
    assert request.kv_blend.spans() == [(1, 10), (10, 21)]
    assert request.kv_blend.standalone(request.all_token_ids, 1) == HEAD + DOC_B
    with pytest.raises(ValueError, match="non-empty and in order"):
        BlendSpec(1, (5, 5), 0.1)
    with pytest.raises(ValueError, match=r"number in \[0, 1\]"):
        BlendSpec(1, (5,), 1.5)


def test_a_blend_step_carries_each_chunks_cached_blocks_and_holds_them_until_it_is_done():
    scheduler = make()
    run(scheduler, Request("a", HEAD + DOC_A, SamplingParams(max_tokens=1)))  # blocks 0, 1 cached; 2 partial
    run(scheduler, Request("b", HEAD + DOC_B, SamplingParams(max_tokens=1)))  # blocks 3, 4, 5 cached
    pool = scheduler.kv.pool
    request = blend_request()
    scheduler.add_request(request)
    out = scheduler.schedule()
    # Chunk A follows the head as it did alone: its whole blocks are an exact prefix hit. The rest is blended.
    assert request.num_computed_tokens == 8 and out.num_scheduled_tokens == {"blend": 15}
    plan = out.kv_blend_plans["blend"]
    assert plan.chunks == [BlendChunk(1, 1, 9, [[0, 1]]), BlendChunk(10, 1, 11, [[3, 4, 5]])]
    assert plan.recompute_ratio == 0.15
    assert [pool.blocks[i].ref_cnt for i in (0, 1, 3, 4, 5)] == [2, 2, 1, 1, 1]  # 0, 1: the hit's too
    scheduler.update_from_output(out, ModelRunnerOutput({"blend": [7]}))
    assert [pool.blocks[i].ref_cnt for i in (0, 1, 3, 4, 5)] == [1, 1, 0, 0, 0]
    # Past the first chunk the blended KV is not what a prefill computes: none of it is cached.
    request.num_computed_tokens = request.num_tokens
    scheduler.kv.cache_full_blocks(request)
    assert scheduler.kv.num_cached_tokens(request.all_token_ids) == 8


def test_a_chunk_the_cache_lacks_has_no_source_blocks():
    scheduler = make()
    run(scheduler, Request("b", HEAD + DOC_B, SamplingParams(max_tokens=1)))
    request = blend_request()
    scheduler.add_request(request)
    plan = scheduler.schedule().kv_blend_plans["blend"]
    assert plan.chunks[0].source_block_ids == [[]]  # chunk A was never cached: computed in full
    assert plan.chunks[1].source_block_ids == [[0, 1, 2]]


def test_in_sliding_groups_only_the_chunks_own_blocks_are_held():
    scheduler = make(sliding_windows=(None, 4))
    run(scheduler, Request("b", HEAD + DOC_B, SamplingParams(max_tokens=1)))
    request = blend_request()
    scheduler.add_request(request)
    out = scheduler.schedule()
    full, sliding = out.kv_blend_plans["blend"].chunks[1].source_block_ids
    assert len(full) == 3 and len(sliding) == 3
    held = [b.block_id for b in scheduler.kv.pool.blocks if b.ref_cnt > 0 and b.block_id in full + sliding]
    assert sorted(held) == sorted(full + sliding)


def test_a_blend_waits_for_a_step_with_room_for_its_whole_prompt():
    scheduler = make(budget=64)
    run(scheduler, Request("b", HEAD + DOC_B, SamplingParams(max_tokens=1)))  # blocks 0, 1, 2
    scheduler.add_request(Request("long", list(range(100, 150)), SamplingParams(max_tokens=4)))
    scheduler.add_request(blend_request())
    out = scheduler.schedule()  # 50 tokens of "long" leave 14, the blend needs 23
    assert set(out.num_scheduled_tokens) == {"long"} and not out.kv_blend_plans
    assert [scheduler.kv.pool.blocks[i].ref_cnt for i in (0, 1, 2)] == [0, 0, 0]  # its sources were let go
    scheduler.update_from_output(out, ModelRunnerOutput({"long": [7]}))
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"long": 1, "blend": 23} and "blend" in out.kv_blend_plans


def test_a_blend_grown_past_one_steps_budget_is_computed_in_full():
    scheduler = make(budget=20)
    request = blend_request()  # 23 tokens: more than a step may carry (the engine refuses such prompts)
    scheduler.add_request(request)
    out = scheduler.schedule()
    assert out.num_scheduled_tokens == {"blend": 20} and not out.kv_blend_plans and request.kv_blend is None
