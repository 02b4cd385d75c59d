"""Cache-augmented generation offline: a pinned prefix survives any amount of other traffic, later prompts that
start with it hit it, pinning more than pins may hold is refused without touching running work, unpin lets go."""
from __future__ import annotations

import pytest
import torch
from tiny_model_folder import BOS_ID, VOCAB_SIZE

from jido import LLM, SamplingParams
from jido.core.pinned_prefixes import PinTooLargeError

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def _random(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB_SIZE, (n,), generator=gen).tolist()


@pytest.fixture
def llm(tiny_model_folder) -> LLM:
    # 48 blocks of 4 tokens in 3 one-layer groups; pins may hold 24.
    return LLM(str(tiny_model_folder), dtype="float32", kv_cache_memory="24KiB", block_size=4, max_num_seqs=1)


def test_a_pinned_prefix_is_hit_after_traffic_that_evicts_everything_else(llm, tiny_model_folder):
    document = [BOS_ID, *_random(29, 0)]
    pin = llm.pin_prefix(document)
    assert pin == {"id": pin["id"], "num_tokens": 30, "num_pinned_tokens": 28}
    for seed in range(1, 6):  # other prompts that together need the whole pool
        llm.generate([[BOS_ID, *_random(40, seed)]], GREEDY, use_tqdm=False)
    question = document + _random(6, 99)
    out = llm.generate([question], GREEDY, use_tqdm=False)[0]
    reference = LLM(str(tiny_model_folder), dtype="float32", kv_cache_memory="1MiB", block_size=4)
    assert out.num_cached_tokens == 28
    assert out.outputs[0].token_ids == reference.generate([question], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    (stats,) = llm.llm_engine.get_scheduler_stats().pinned
    # The full group's 7 blocks, and per sliding group (window 4) the 1 block the next query sees.
    assert (stats.pin_id, stats.num_tokens, stats.num_blocks, stats.hits) == (pin["id"], 28, 9, 1)


def test_pinning_more_than_pins_may_hold_is_refused_and_nothing_is_pinned(llm):
    llm.pin_prefix([BOS_ID, *_random(60, 0)])  # 15 full blocks + 1 per sliding group: 17 of the 24 pins may hold
    with pytest.raises(PinTooLargeError, match=r"pinning 41 tokens takes 15 KV blocks but only 7 of the pool's 48 "
                                               r"may still be pinned \(pins may hold 50% of it; 17 are pinned now\)"):
        llm.pin_prefix([BOS_ID, *_random(40, 1)])
    assert len(llm.llm_engine.get_scheduler_stats().pinned) == 1
    assert not llm.llm_engine.has_unfinished_requests()


def test_unpin_lets_the_pool_evict_the_prefix_again(llm):
    document = [BOS_ID, *_random(29, 0)]
    pin = llm.pin_prefix(document)
    llm.unpin_prefix(pin["id"])
    assert llm.llm_engine.get_scheduler_stats().pinned == ()
    for seed in range(1, 6):
        llm.generate([[BOS_ID, *_random(40, seed)]], GREEDY, use_tqdm=False)
    assert llm.generate([document + [5, 6]], GREEDY, use_tqdm=False)[0].num_cached_tokens == 0
    with pytest.raises(KeyError):
        llm.unpin_prefix(pin["id"])
