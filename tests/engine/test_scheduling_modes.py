"""Scheduling modes on the default model: the same greedy tokens, batched differently (continuous, dynamic, static)."""
from __future__ import annotations

import pytest

from jido import LLM, SamplingParams

pytestmark = pytest.mark.slow

FIRST = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
LATER = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
# r0 arrives alone; r1..r3 arrive after the engine's first chance to start it. With 4 seats:
EXPECTED_BATCH_SIZES = {
    "continuous": [1, 4, 4, 4, 4, 1],  # r1..r3 join r0 at once; r0 finishes last
    "static": [1, 1, 1, 1, 1, 1, 3, 3, 3, 3],  # r0's batch of one runs to completion before r1..r3 start
    "dynamic": [4, 4, 4, 4, 1, 1],  # r0 waits for the batch to fill, then all four run together
}


def prompts(gemma_reference: dict) -> list[list[int]]:
    return [g["prompt_ids"][:40] for g in gemma_reference["generations"][:4]]


def run_arrivals(llm: LLM, prompt_ids: list[list[int]]) -> tuple[list[int], dict[str, list[int]]]:
    """r0 first; the rest once the engine has stepped (or, while it holds r0 back for a batch, waited) once.

    Returns the batch size of every step that computed, and each request's tokens.
    """
    engine = llm.llm_engine
    engine.add_request("r0", prompt_ids[0], FIRST)
    sizes, tokens = [], {}

    def step() -> None:
        for output in engine.step():
            tokens.setdefault(output.request_id, []).extend(output.outputs[0].token_ids)
        if engine.last_iteration_stats.num_reqs:
            sizes.append(engine.last_iteration_stats.num_reqs)

    if engine.get_scheduler_stats().admission_wait_s == 0:
        step()
    for i, ids in enumerate(prompt_ids[1:], start=1):
        engine.add_request(f"r{i}", ids, LATER)
    while engine.has_unfinished_requests():
        step()
    return sizes, tokens


@pytest.fixture(scope="module")
def reference(llm, gemma_reference) -> dict[str, list[int]]:
    ids = prompts(gemma_reference)
    return {f"r{i}": llm.generate([p], FIRST if i == 0 else LATER, use_tqdm=False)[0].outputs[0].token_ids
            for i, p in enumerate(ids)}


@pytest.mark.parametrize("mode", ["continuous", "static", "dynamic"])
def test_scheduling_modes_give_the_unbatched_tokens_in_their_own_batches(mode, gemma_reference, reference):
    # Float weights, as the unbatched reference (the llm fixture): the default gguf kernels round x to int8.
    llm = LLM(kv_cache_memory="64MiB", dtype="float32", quantization="none", max_num_seqs=4, scheduling_mode=mode,
              max_batch_wait_ms=60_000)
    sizes, tokens = run_arrivals(llm, prompts(gemma_reference))
    assert tokens == reference
    assert sizes == EXPECTED_BATCH_SIZES[mode]
