"""Speculative decoding gives the tokens the target alone gives: greedy identical, seeded identical, same distribution.

The n-gram proposer is deterministic, so verification draws at each position exactly what a step without
speculation draws there: greedy and seeded requests must get the very tokens of the plain run (up to a
near-tie that verifying several positions at once rounds the other way), while the scheduler's bookkeeping
(lookahead slots, rolled-back proposals, stops inside an accepted run) is exercised by every step.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jsonschema
import pytest
import torch
from distribution_checks import MIN_P_VALUE, nucleus_probs, randomized_pit, uniformity_p_value
from near_tie import assert_same_until_a_near_tie
from tiny_model_folder import BOS_ID, write_tiny_model_folder
from transformers import AutoModelForCausalLM

from jido import LLM, SamplingParams, StructuredOutputsParams

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
NAMES = ["capital", "story", "korean", "code", "long_argparse", "long_textwrap"]
# Verifying K + 1 positions multiplies K + 1 rows of activations at once, which rounds in another order than
# one row (the streaming kernel keeps fewer partial sums per row; measured: about 1e-5 per linear layer on
# Gemma 3 270M's shapes). A greedy choice may differ only where the top two logits are that close.
VERIFY_NOISE_LOGIT_GAP = 0.02


@pytest.fixture(scope="module")
def spec_llm() -> LLM:
    return LLM(kv_cache_memory="160MiB", dtype="float32", quantization="none", speculative_config=NGRAM)


def test_greedy_outputs_with_ngram_speculation_equal_the_plain_runs_on_every_fixture_prompt(llm, spec_llm,
                                                                                           gemma_reference):
    gens = [next(g for g in gemma_reference["generations"] if g["name"] == name) for name in NAMES]
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    prompts = [g["prompt_ids"] for g in gens]
    before = spec_llm.llm_engine.get_scheduler_stats().spec_decoding
    plain = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    spec = [o.outputs[0].token_ids for o in spec_llm.generate(prompts, params, use_tqdm=False)]
    for name, gen, ours, theirs in zip(NAMES, gens, spec, plain):
        # The plain run is the reference; the fixture's gaps are transformers' top-2 gaps along it.
        assert_same_until_a_near_tie(name, ours, {**gen, "output_ids": theirs}, VERIFY_NOISE_LOGIT_GAP)
    stats = spec_llm.llm_engine.get_scheduler_stats().spec_decoding
    assert stats.num_accepted_tokens - before.num_accepted_tokens > 20  # the proposals did carry tokens



RECORD_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["name", "tags"],
                 "properties": {"name": {"type": "string", "maxLength": 20},
                                "tags": {"type": "array", "maxItems": 4, "items": {"type": "string", "maxLength": 12}}}}
# The prompts hold JSON, so the n-gram proposer has JSON to propose, some of it past what the schema allows.
RECORD_PROMPTS = ['{"name": "ada", "tags": ["math", "code"]}\n{"name": "alan", "tags": ["code", "math"]}\n',
                  'Records: {"name": "grace", "tags": ["navy"]} {"name": "grace", "tags": ["navy", "code"]} Next:']


def test_structured_outputs_with_ngram_speculation_follow_the_schema_and_keep_the_plain_greedy_tokens(llm, spec_llm):
    schema = StructuredOutputsParams(json=RECORD_SCHEMA)
    greedy = SamplingParams(temperature=0, max_tokens=48, structured_outputs=schema, logprobs=20)
    seeded = SamplingParams(temperature=0.8, seed=5, max_tokens=48, structured_outputs=schema)
    before = spec_llm.llm_engine.get_scheduler_stats().spec_decoding
    spec = [o.outputs[0] for o in spec_llm.generate(RECORD_PROMPTS * 2, [greedy] * 2 + [seeded] * 2, use_tqdm=False)]
    for completion in spec:
        assert completion.finish_reason == "stop", completion.text
        jsonschema.validate(json.loads(completion.text), RECORD_SCHEMA)
    stats = spec_llm.llm_engine.get_scheduler_stats().spec_decoding
    assert stats.num_accepted_tokens - before.num_accepted_tokens >= 4  # proposals were verified under the grammar
    for prompt, ours in zip(RECORD_PROMPTS, spec[:2]):
        theirs = llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0]
        same = next((i for i, (a, b) in enumerate(zip(ours.token_ids, theirs.token_ids)) if a != b), None)
        if same is None:
            assert ours.token_ids == theirs.token_ids
            continue
        # Where they part, both tokens were allowed and the plain run's logits held them within verify noise.
        top = theirs.logprobs[same]
        assert ours.token_ids[same] in top, f"{prompt!r}: spec token at {same} is not in the plain run's top 20"
        gap = top[theirs.token_ids[same]].logprob - top[ours.token_ids[same]].logprob
        assert gap < VERIFY_NOISE_LOGIT_GAP, f"{prompt!r}: parted at {same} with a logit gap of {gap}"

# -- tiny random models: cheap steps, and the same exactness ----------------------------------------------
PEAKED = {"weight_scale": 0.2, "final_logit_softcapping": 7.0}  # repeats itself: proposals often hold
SMALL_POOL = "16MiB"  # the default 2 GiB would be a million blocks of a tiny model's KV, made at start
# A separate draft with half the target's head size: its KV pages are half a target page, two to a pool layer.
DRAFT_SHAPE = {"head_dim": 8, "num_hidden_layers": 2, "layer_types": ["sliding_attention", "full_attention"]}
PROPOSERS = ["ngram", "draft model", "self-draft", "eagle", "medusa"]


@pytest.fixture(scope="module")
def peaked_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model_folder(tmp_path_factory.mktemp("peaked-gemma3"), **PEAKED)


@pytest.fixture(scope="module")
def draft_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model_folder(tmp_path_factory.mktemp("draft-gemma3"), seed=1, **PEAKED, **DRAFT_SHAPE)


def speculative_config(proposer: str, draft_folder: Path, target: Path, draft_for) -> dict:
    if proposer == "ngram":
        return NGRAM
    if proposer == "draft model":
        return {"method": "draft_model", "num_speculative_tokens": 3, "model": str(draft_folder)}
    if proposer == "eagle":
        return {"method": "eagle", "num_speculative_tokens": 3, "model": str(draft_for(target)[0])}
    if proposer == "medusa":
        return {"method": "medusa", "num_speculative_tokens": 3, "model": str(draft_for(target, "medusa")[0])}
    return {"method": "draft_model", "num_speculative_tokens": 3, "num_layers": 2}  # 2 of the target's 3 layers


def _generate(llm: LLM, prompts: list, params: list[SamplingParams] | SamplingParams) -> list[tuple]:
    return [(c.token_ids, c.text, c.finish_reason, c.stop_reason, c.logprobs)
            for o in llm.generate(prompts, params, use_tqdm=False) for c in o.outputs]


# 40 KiB of cache (20 blocks) for six requests forces preemptions; 16 tokens per step chunks every prompt.
TIGHT = {"dtype": "float32", "kv_cache_memory": "40KiB", "max_num_batched_tokens": 16}
_LONG = " ".join(f"w{5 + (i * 7) % 40}" for i in range(40))
GREEDY_PROMPTS = ["w5 w9 w17 w5 w9 w17 w5 w9", _LONG, _LONG, "w60 w61 w62 w60 w61", "w3", _LONG + " w9 w9"]
GREEDY_PARAMS = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True),
                 SamplingParams(temperature=0, max_tokens=25, logprobs=2),
                 SamplingParams(temperature=0, max_tokens=30, stop=["w32 w32 w32"]),  # inside an accepted run
                 SamplingParams(temperature=0, max_tokens=9),
                 SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, n=2),
                 SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop_token_ids=[9], min_tokens=3)]


@pytest.fixture(scope="module")
def plain_greedy(tiny_model_folder: Path) -> list[tuple]:
    return _generate(LLM(model=str(tiny_model_folder), **TIGHT), GREEDY_PROMPTS, GREEDY_PARAMS)


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_chunked_prefill_prefix_hits_preemption_and_stops_inside_accepted_runs_keep_the_plain_greedy_outputs(
        tiny_model_folder, draft_folder, draft_for, plain_greedy, proposer):
    config = speculative_config(proposer, draft_folder, tiny_model_folder, draft_for)
    spec_llm = LLM(model=str(tiny_model_folder), **TIGHT, speculative_config=config)
    spec = _generate(spec_llm, GREEDY_PROMPTS, GREEDY_PARAMS)
    plain = plain_greedy
    for ours, theirs in zip(spec, plain):
        assert ours[:4] == theirs[:4]
        assert [lp.sampled_token_id for lp in ours[4] or []] == [lp.sampled_token_id for lp in theirs[4] or []]
        for a, b in zip(ours[4] or [], theirs[4] or []):  # the target's logprobs, as without speculation
            assert a.sampled_logprob == pytest.approx(b.sampled_logprob, abs=1e-4) and a.top_token_ids == b.top_token_ids
    stats = spec_llm.llm_engine.get_scheduler_stats()
    assert stats.num_preemptions > 0 and stats.prefix_cache_hits > 0
    # Enough accepted tokens that accepted runs (and stops inside them) were exercised. Medusa's heads, trained
    # 200 steps on the tiny target, accept fewer, and how many depends on the CPU's float sums in training
    # (AVX2 EPYC: 32-40; AMX Xeon: over 40).
    assert stats.spec_decoding.num_accepted_tokens > (20 if proposer == "medusa" else 40)
    assert {r[2] for r in spec} == {"length", "stop"} and any(r[3] == "w32 w32 w32" for r in spec)


def test_automatic_k_keeps_the_plain_greedy_outputs(tiny_model_folder, plain_greedy):
    auto = {**NGRAM, "num_speculative_tokens": "auto"}
    spec_llm = LLM(model=str(tiny_model_folder), **TIGHT, speculative_config=auto)
    assert [r[:4] for r in _generate(spec_llm, GREEDY_PROMPTS, GREEDY_PARAMS)] == [r[:4] for r in plain_greedy]
    assert spec_llm.llm_engine.get_scheduler_stats().spec_decoding.num_accepted_tokens > 40


@pytest.mark.parametrize("proposer", PROPOSERS)
def test_seeded_sampling_with_speculation_is_reproducible_batched_or_not(peaked_folder, draft_folder, draft_for,
                                                                         proposer):
    settings = dict(model=str(peaked_folder), dtype="float32", kv_cache_memory=SMALL_POOL)
    prompts = ["w5 w9 w17 w5 w9 w17 w5 w9", "w40 w83 w83 w83", "w7 w8 w7 w8 w7"]
    params = [SamplingParams(temperature=0.8, seed=1, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=0.7, top_p=0.9, top_k=20, seed=2, max_tokens=24, ignore_eos=True),
              SamplingParams(temperature=1.0, min_p=0.05, seed=3, max_tokens=24, ignore_eos=True,
                             frequency_penalty=0.5, presence_penalty=0.3, repetition_penalty=1.2)]
    spec_llm = LLM(**settings, speculative_config=speculative_config(proposer, draft_folder, peaked_folder, draft_for))
    batched = [r[0] for r in _generate(spec_llm, prompts, params)]
    alone = [_generate(spec_llm, [p], q)[0][0] for p, q in zip(prompts, params)]
    assert batched == alone
    assert spec_llm.llm_engine.get_scheduler_stats().spec_decoding.num_accepted_tokens > 10
    if proposer == "ngram":
        # A point-mass proposal is verified by the target's own draw at each position: the plain run's tokens.
        assert batched == [r[0] for r in _generate(LLM(**settings), prompts, params)]


STATISTICAL = {"temperature 0.7": SamplingParams(temperature=0.7), "top-p 0.9": SamplingParams(temperature=0.7, top_p=0.9),
               "penalties": SamplingParams(temperature=0.7, frequency_penalty=0.4, presence_penalty=0.2)}
# n-gram proposals are point masses (the fused rule); the draft models' come with a distribution q (the
# min(1, p / q) test and the residual draws).
STATISTICAL_CASES = [("ngram", "penalties"), ("draft model", "top-p 0.9"), ("self-draft", "temperature 0.7"),
                     ("eagle", "temperature 0.7"), ("medusa", "top-p 0.9")]
NUM_SAMPLES, NUM_POSITIONS = 1500, 6


def _reference_probs(folder: Path, sequences: torch.Tensor, num_prompt: int, params: SamplingParams) -> torch.Tensor:
    """transformers' float64 distribution at each generated position, shaped by ``params``: [N, T, vocab]."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = model(sequences).logits[:, num_prompt - 1:-1]
    outputs = sequences[:, num_prompt:]
    # Frequency and presence penalties count the output tokens before each position.
    counts = torch.zeros(*outputs.shape, logits.shape[-1], dtype=torch.float64)
    counts[:, 1:].scatter_add_(2, outputs[:, :-1, None], torch.ones(*outputs[:, :-1].shape, 1, dtype=torch.float64))
    counts = counts.cumsum(dim=1)
    logits = logits - params.frequency_penalty * counts - params.presence_penalty * (counts > 0)
    return nucleus_probs(logits.flatten(0, 1), params.temperature, params.top_p).view_as(logits)


@pytest.mark.parametrize("proposer, name", STATISTICAL_CASES)
def test_every_generated_position_follows_the_models_distribution_with_speculation(peaked_folder, draft_folder,
                                                                                    draft_for, proposer, name):
    params = dataclasses.replace(STATISTICAL[name], max_tokens=NUM_POSITIONS, ignore_eos=True)
    config = speculative_config(proposer, draft_folder, peaked_folder, draft_for)
    if proposer == "medusa":
        # Medusa's third head guesses four tokens past the state it reads: its proposals held only 17 times in
        # 1,500 samples here, too few to check every depth emits both ways; the first two held 1,773 and 155 times.
        config = {**config, "num_speculative_tokens": 2}
    llm = LLM(model=str(peaked_folder), dtype="float32", max_num_seqs=512, kv_cache_memory=SMALL_POOL,
              speculative_config=config)
    prompt = [BOS_ID, 9, 17, 9, 17, 9, 17, 9]
    outputs = llm.generate([prompt] * NUM_SAMPLES, params, use_tqdm=False)
    sequences = torch.tensor([prompt + o.outputs[0].token_ids for o in outputs])
    probs = _reference_probs(peaked_folder, sequences, len(prompt), params)
    generator = torch.Generator().manual_seed(0)
    for position in range(NUM_POSITIONS):
        pit = randomized_pit(probs[:, position], sequences[:, len(prompt) + position], generator)
        assert uniformity_p_value(pit) > MIN_P_VALUE, position
    # Proposals held at every depth, so each position was emitted both ways: verified and replaced.
    per_pos = llm.llm_engine.get_scheduler_stats().spec_decoding.num_accepted_tokens_per_pos
    assert len(per_pos) == config["num_speculative_tokens"] and min(per_pos) > 20, per_pos
