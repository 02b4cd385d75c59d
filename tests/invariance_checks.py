"""batch_invariant's end-to-end check: a request's logprobs (so every bit of its logits that shows) and greedy tokens
are the same alone, batched beside prompts of other lengths in either order, after a cached prefix of several lengths,
and under several chunked-prefill budgets."""
from __future__ import annotations

import random

from jido import LLM, SamplingParams

# Greedy continuations with every generated token's top-20 logprobs, which move with any bit of the logits.
PARAMS = SamplingParams(temperature=0, max_tokens=6, logprobs=20, ignore_eos=True)
# The same with each prompt token's top-5 (such requests take no prefix-cache hit, so every prompt row is computed).
SCORED = SamplingParams(temperature=0, max_tokens=3, logprobs=20, prompt_logprobs=5, ignore_eos=True)
RUNS = {"plain": PARAMS, "scored": SCORED}
# Under and over 16 rows (where the default attention changes kernels), longer than the chunk budgets below.
LENGTHS = (70, 5, 33, 110, 17, 91)
LONGEST = 3


def prompts(bos_id: int, vocab_size: int) -> list[list[int]]:
    """Random prompts of :data:`LENGTHS` tokens after ``bos_id``, from ids 3 and up (past the special ones)."""
    rng = random.Random(0)
    return [[bos_id] + [rng.randrange(3, vocab_size) for _ in range(n)] for n in LENGTHS]


def results(llm: LLM, batch: list[list[int]], params: SamplingParams) -> list[tuple]:
    """Per prompt: its tokens, their logprobs (top-20 each) and its prompt logprobs."""
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs, o.prompt_logprobs)
            for o in llm.generate([{"prompt_token_ids": ids} for ids in batch], params, use_tqdm=False)]


def check_invariance(model: str, quantization: str, batch: list[list[int]]) -> None:
    """Assert each prompt of ``batch`` gets the very results it gets alone in every one of those situations."""
    engine = dict(model=model, quantization=quantization, dtype="float32", kv_cache_memory="8MiB",
                  batch_invariant=True)
    llm = LLM(**engine)
    alone: dict[str, list[tuple]] = {}
    for name, params in RUNS.items():
        alone[name] = []
        for ids in batch:
            llm.reset_prefix_cache()
            alone[name] += results(llm, [ids], params)
        llm.reset_prefix_cache()
        assert results(llm, batch, params) == alone[name], name
        assert results(llm, batch[::-1], params) == alone[name][::-1], name
    for cached in (16, 64, 96):  # the rest runs as 15-95 rows, a decode-sized step among them
        llm.reset_prefix_cache()
        llm.generate([{"prompt_token_ids": batch[LONGEST][:cached + 2]}], SamplingParams(max_tokens=1),
                     use_tqdm=False)
        warm = llm.generate([{"prompt_token_ids": batch[LONGEST]}], PARAMS, use_tqdm=False)[0]
        assert warm.num_cached_tokens == cached
        assert (warm.outputs[0].token_ids, warm.outputs[0].logprobs, None) == alone["plain"][LONGEST], cached
    for budget in (16, 23, 50):
        chunked = LLM(**{**engine, "max_num_batched_tokens": budget, "max_num_prefill_tokens_while_decoding": budget,
                         "max_model_len": 128})
        for name, params in RUNS.items():
            assert results(chunked, batch, params) == alone[name], (budget, name)
        chunked.shutdown()
    llm.shutdown()
