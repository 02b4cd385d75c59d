"""Batched filters against the one-row-at-a-time reference, bit for bit, over random rows and settings."""
from __future__ import annotations

import math
import random

import pytest
import torch
from reference_sampler import reference_filtered_probs, reference_penalties

from jido.core.sampling_params import SamplingParams
from jido.sampling.filters import apply_penalties, filtered_probs

VOCAB = 4096


def random_filter_params(rng: random.Random, all_top_k: bool) -> SamplingParams:
    return SamplingParams(
        temperature=rng.uniform(0.2, 1.5),
        top_k=rng.randint(1, 60) if all_top_k or rng.random() < 0.5 else rng.choice([0, -1, VOCAB, VOCAB + 7]),
        top_p=rng.uniform(0.3, 0.99) if rng.random() < 0.6 else 1.0,
        min_p=rng.uniform(0.01, 0.3) if rng.random() < 0.4 else 0.0)


def random_logits(num_rows: int, quantized: bool, seed: int) -> torch.Tensor:
    logits = torch.randn(num_rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3
    # Rounding makes runs of equal logits, as bf16 models give: ties at the top-k and top-p cuts.
    return torch.round(logits * 2) / 2 if quantized else logits


def column(params: list[SamplingParams], name: str, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor([max(getattr(p, name), 0) if name == "top_k" else getattr(p, name) for p in params],
                        dtype=dtype)


@pytest.mark.parametrize("quantized", [False, True], ids=["float", "ties"])
@pytest.mark.parametrize("all_top_k", [False, True], ids=["mixed", "top_k_everywhere"])
def test_filtered_probs_equal_the_one_row_computation_bit_for_bit(quantized, all_top_k):
    rng = random.Random(f"{quantized}{all_top_k}")
    for trial in range(6):
        params = [random_filter_params(rng, all_top_k) for _ in range(12)]
        logits = random_logits(len(params), quantized, seed=trial)
        probs = filtered_probs(logits.clone(), column(params, "temperature", torch.float32),
                               column(params, "top_k", torch.int64), column(params, "top_p", torch.float32),
                               column(params, "min_p", torch.float32)).full_rows(torch.arange(len(params)))
        for i, p in enumerate(params):
            assert torch.equal(probs[i], reference_filtered_probs(logits[i], p)), (trial, i, p)


def test_top_p_cut_inside_a_run_of_equal_probabilities_keeps_the_sorted_choice():
    logits = torch.full((2, VOCAB), -5.0)
    tied = [3000, 7, 2500, 1200, 40]
    logits[:, 100] = 5.0
    logits[:, tied] = 4.0
    p_top, p_tied = math.e / (math.e + 5), 1 / (math.e + 5)
    # top-k leaves six tokens; top-p cuts after the second of the five tied ones.
    params = SamplingParams(temperature=1.0, top_k=6, top_p=p_top + 1.5 * p_tied)
    probs = filtered_probs(logits.clone(), torch.ones(2), torch.tensor([6, 6]), torch.full((2,), params.top_p))
    assert probs.token_ids is not None  # the truncated path, where the tie needs the full sort
    probs = probs.full_rows(torch.arange(2))
    expected = reference_filtered_probs(logits[0], params)
    assert int((expected[tied] > 0).sum()) == 2
    assert torch.equal(probs[0], expected) and torch.equal(probs[1], expected)


def test_penalties_equal_the_one_row_computation_bit_for_bit_and_leave_other_rows_alone():
    rng = random.Random(5)
    params = [SamplingParams(repetition_penalty=rng.choice([1.0, rng.uniform(0.5, 2.0)]),
                             presence_penalty=rng.choice([0.0, rng.uniform(-2, 2)]),
                             frequency_penalty=rng.choice([0.0, rng.uniform(-2, 2)])) for _ in range(10)]
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(0, 40))] for _ in params]
    outputs = [[rng.randrange(50) for _ in range(rng.randint(0, 30))] for _ in params]
    mask = torch.zeros(len(params), VOCAB, dtype=torch.bool)
    counts = torch.zeros(len(params), VOCAB, dtype=torch.int32)
    for i, (prompt, output) in enumerate(zip(prompts, outputs)):
        mask[i, prompt] = True
        counts[i] = torch.bincount(torch.tensor(output, dtype=torch.long), minlength=VOCAB)
    logits = random_logits(2 * len(params), quantized=False, seed=9)
    rows = torch.arange(1, 2 * len(params), 2)  # the odd rows have penalties
    penalized = logits.clone()
    penalties = [column(params, name, torch.float32)
                 for name in ("repetition_penalty", "presence_penalty", "frequency_penalty")]
    apply_penalties(penalized, rows, mask, counts, *penalties)
    assert torch.equal(penalized[::2], logits[::2])
    for i, p in enumerate(params):
        expected = logits[rows[i]].clone()
        reference_penalties(expected, p, prompts[i], outputs[i])
        assert torch.equal(penalized[rows[i]], expected), (i, p)


def test_top_k_ties_past_the_candidates_keep_full_probabilities():
    logits = torch.zeros(2, VOCAB)
    logits[:, :3] = torch.tensor([3.0, 2.0, 1.0])
    # 300 tokens tie with the 5th highest logit (0.0 from position 3 on): top-k keeps all of them.
    logits[:, 303:] = -1.0
    params = SamplingParams(temperature=0.9, top_k=5, top_p=0.6)
    probs = filtered_probs(logits.clone(), torch.full((2,), 0.9), torch.tensor([5, 5]), torch.full((2,), 0.6))
    assert probs.token_ids is None
    expected = reference_filtered_probs(logits[0], params)
    assert int((expected > 0).sum()) > 5
    assert torch.equal(probs.values[0], expected) and torch.equal(probs.values[1], expected)
