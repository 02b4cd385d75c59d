"""Cache-augmented generation offline: a pinned prefix survives any amount of other traffic, later prompts that
start with it hit it, pinning more than pins may hold is refused without touching running work, unpin lets go."""
from __future__ import annotations

import pytest
import torch
from tiny_model_folder import BOS_ID, VOCAB_SIZE

from jido import LLM, SamplingParams
from jido.core.pinned_prefixes import PinTooLargeError, TooManyPinsError

GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


def _random(n: int, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB_SIZE, (n,), generator=gen).tolist()


@pytest.fixture
def llm(tiny_model_folder) -> LLM:
    # 96 blocks of 4 tokens in 3 one-layer groups; a 64-token request peaks at 48, so pins may hold 48.
    return LLM(str(tiny_model_folder), dtype="float32", kv_cache_memory="48KiB", block_size=4, max_num_seqs=1,
               max_model_len=64)


def test_a_pinned_prefix_is_hit_after_traffic_that_evicts_everything_else(llm, tiny_model_folder):
    document = [BOS_ID, *_random(29, 0)]
    pin = llm.pin_prefix(document)
    assert pin == {"id": pin["id"], "num_tokens": 30, "num_pinned_tokens": 28}
    for seed in range(1, 9):  # other prompts that together need the whole pool
        llm.generate([[BOS_ID, *_random(40, seed)]], GREEDY, use_tqdm=False)
    question = document + _random(6, 99)
    out = llm.generate([question], GREEDY, use_tqdm=False)[0]
    reference = LLM(str(tiny_model_folder), dtype="float32", kv_cache_memory="1MiB", block_size=4)
    assert out.num_cached_tokens == 28
    assert out.outputs[0].token_ids == reference.generate([question], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    (stats,) = llm.llm_engine.get_scheduler_stats().pinned
    # The full group's 7 blocks, and per sliding group (window 4) the 1 block the next query sees.
    assert (stats.pin_id, stats.num_tokens, stats.num_blocks, stats.hits) == (pin["id"], 28, 9, 1)


def test_a_pin_that_would_not_leave_room_for_a_full_length_request_is_refused(llm):
    for seed in (0, 1):
        llm.pin_prefix([BOS_ID, *_random(59, seed)])  # 17 blocks each: 15 full, 1 per sliding group
    with pytest.raises(PinTooLargeError, match=r"pinning 41 tokens holds 15 KV blocks, but only 14 of the pool's 96 "
                                               r"can be pinned while a 64-token request still fits beside the pins "
                                               r"\(34 blocks are pinned\)"):
        llm.pin_prefix([BOS_ID, *_random(40, 2)])
    assert len(llm.llm_engine.get_scheduler_stats().pinned) == 2 and not llm.llm_engine.has_unfinished_requests()
    long = llm.generate([[BOS_ID, *_random(59, 3)]], GREEDY, use_tqdm=False)[0]  # still fits beside the pins
    assert len(long.outputs[0].token_ids) == GREEDY.max_tokens


def test_unpin_lets_the_pool_evict_the_prefix_again(llm):
    document = [BOS_ID, *_random(29, 0)]
    pin = llm.pin_prefix(document)
    llm.unpin_prefix(pin["id"])
    assert llm.llm_engine.get_scheduler_stats().pinned == ()
    for seed in range(1, 9):
        llm.generate([[BOS_ID, *_random(40, seed)]], GREEDY, use_tqdm=False)
    assert llm.generate([document + [5, 6]], GREEDY, use_tqdm=False)[0].num_cached_tokens == 0
    with pytest.raises(KeyError):
        llm.unpin_prefix(pin["id"])


def test_a_prompt_shorter_than_a_block_is_refused_as_it_would_pin_nothing(llm):
    with pytest.raises(ValueError, match=r"^the prompt has 3 tokens, less than one KV block \(4 tokens\): a pin holds "
                                         "whole blocks, so it would hold nothing; pin a longer prefix$"):
        llm.pin_prefix([BOS_ID, *_random(2, 7)])
    assert llm.pin_prefix([BOS_ID, *_random(3, 7)])["num_pinned_tokens"] == 4  # one block: the least a pin holds
    assert llm.llm_engine.get_scheduler_stats().pinned[0].num_blocks > 0


def test_pins_past_max_pinned_prefixes_are_refused_until_one_is_unpinned(tiny_model_folder):
    llm = LLM(str(tiny_model_folder), dtype="float32", kv_cache_memory="48KiB", block_size=4, max_model_len=64,
              max_pinned_prefixes=2)
    first, _ = (llm.pin_prefix([BOS_ID, *_random(7, seed)]) for seed in (1, 2))
    with pytest.raises(TooManyPinsError, match="^max_pinned_prefixes=2 prefixes are pinned or being pinned already"):
        llm.pin_prefix([BOS_ID, *_random(7, 3)])
    assert len(llm.llm_engine.get_scheduler_stats().pinned) == 2
    llm.unpin_prefix(first["id"])
    assert llm.pin_prefix([BOS_ID, *_random(7, 3)])["num_pinned_tokens"] == 8
