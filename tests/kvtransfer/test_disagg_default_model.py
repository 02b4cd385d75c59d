"""The real default model, float32, handed from a producer engine to a consumer engine over tcp: greedy tokens equal
transformers' (and so the co-located run's) on engine fixture prompts, one longer than the sliding window, with
only the window of the sliding layers on the wire. (The tiny model's tests cover every transport and mode.)"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from jido.config import EngineConfig
from jido.core.sampling_params import SamplingParams
from jido.engine.llm_engine import LLMEngine

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from near_tie import NEAR_TIE_LOGIT_GAP, assert_same_until_a_near_tie  # noqa: E402

pytestmark = pytest.mark.slow
NAMES = ("capital", "korean", "long_argparse")  # English, Korean, 616 tokens (the window is 512)
NUM_TOKENS = 8


def _engine(role: str, mode: str) -> LLMEngine:
    return LLMEngine(EngineConfig.from_kwargs(
        dtype="float32", kv_cache_memory="160MiB",
        kv_transfer_config={"kv_connector": "tcp", "kv_role": role, "kv_port": 0, "kv_mode": mode}))


def _finish(engine: LLMEngine, req_id: str, prompt: list[int], params: SamplingParams, kv: dict | None,
            also: LLMEngine | None = None):
    engine.add_request(req_id, prompt, params, kv_transfer_params=kv)
    output = None
    while engine.has_unfinished_requests():
        for delta in engine.step():
            output = delta if output is None else (output.add(delta) or output)
        if also is not None and also.has_engine_work():
            also.step()
    return output


def test_default_model_through_producer_and_consumer_matches_transformers(gemma_reference):
    producer, consumer = _engine("kv_producer", "pull"), _engine("kv_consumer", "pull")
    try:
        _hand_over_each(producer, consumer, gemma_reference)
    finally:
        producer.shutdown()
        consumer.shutdown()


def _hand_over_each(producer: LLMEngine, consumer: LLMEngine, gemma_reference: dict) -> None:
    ask = {"do_remote_decode": True}
    gens = [g for g in gemma_reference["generations"] if g["name"] in NAMES]
    for gen in gens:
        prompt = gen["prompt_ids"]
        prefilled = _finish(producer, f"p-{gen['name']}", prompt, SamplingParams(temperature=0, max_tokens=1), ask)
        params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True)
        out = _finish(consumer, f"c-{gen['name']}", prompt, params, prefilled.kv_transfer_params, also=producer)
        assert out.num_cached_tokens == len(prompt) - 1, gen["name"]
        expected = {**gen, "output_ids": gen["output_ids"][:NUM_TOKENS]}
        assert_same_until_a_near_tie(gen["name"], out.outputs[0].token_ids, expected, NEAR_TIE_LOGIT_GAP)
    stats = consumer.get_scheduler_stats().kv_connector[0]
    assert stats.failed == 0 and stats.received == len(gens)
    # Gemma 3 270M: 18 layers of 1 KV head x 256 dims, 5 of 6 layer groups slide over 512 tokens; float32.
    full_bytes = sum(-(-(len(g["prompt_ids"]) - 1) // 16) * 16 for g in gens) * 18 * 2 * 256 * 4
    assert stats.received_bytes < full_bytes
