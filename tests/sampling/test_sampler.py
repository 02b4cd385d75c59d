"""The batched sampler against the one-row-at-a-time reference: same greedy and seeded tokens, same distribution."""
from __future__ import annotations

import math
import random

import pytest
import torch
from reference_sampler import Row, reference_filtered_probs, reference_sample

from jido.core.sampling_params import SamplingParams
from jido.sampling.batch import SamplingBatch
from jido.sampling.sampler import Sampler, argmax

VOCAB = 4096
EOS = (1, 2)


def random_row(rng: random.Random, all_top_k: bool) -> Row:
    """A row with a random mix of every setting; ids >= VOCAB stand for tokenizer entries the logits lack."""
    def sometimes(value: object, default: object, chance: float = 0.3) -> object:
        return value if rng.random() < chance else default

    min_tokens = sometimes(rng.randint(1, 6), 0)
    params = SamplingParams(
        temperature=sometimes(0.0, rng.uniform(0.2, 1.5)),
        top_k=rng.randint(1, 60) if all_top_k else sometimes(rng.randint(1, 60), rng.choice([0, -1, VOCAB + 3]), 0.5),
        top_p=sometimes(rng.uniform(0.3, 0.99), 1.0, 0.5), min_p=sometimes(rng.uniform(0.01, 0.3), 0.0),
        repetition_penalty=sometimes(rng.uniform(0.5, 2.0), 1.0),
        presence_penalty=sometimes(rng.uniform(-2, 2), 0.0), frequency_penalty=sometimes(rng.uniform(-2, 2), 0.0),
        seed=sometimes(rng.choice([rng.randrange(1000), -rng.randrange(2**63), rng.randrange(2**63)]), None, 0.5),
        min_tokens=min_tokens, max_tokens=16, ignore_eos=sometimes(True, False, 0.5),
        stop_token_ids=sometimes([rng.randrange(VOCAB) for _ in range(rng.randint(1, 3))] + [VOCAB + 1], None, 0.5),
        logprobs=sometimes(rng.randint(0, 5), None))
    prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))] + [VOCAB + 2]
    output = [rng.randrange(100) for _ in range(rng.randint(0, 8))]
    return Row(params, prompt, output, EOS)


def batch_of(rows: list[Row], vocab: int = VOCAB) -> SamplingBatch:
    batch = SamplingBatch(len(rows), vocab)
    for slot, row in enumerate(rows):
        batch.add_request(slot, row.params, row.prompt_token_ids, row.output_token_ids, row.eos_token_ids)
    return batch


def sample(rows: list[Row], logits: torch.Tensor, seed: int = 0) -> list[int]:
    return Sampler(seed).sample(logits.clone(), batch_of(rows, logits.shape[-1]).metadata(range(len(rows)))).token_ids


@pytest.mark.parametrize("quantized", [False, True], ids=["float", "ties"])
@pytest.mark.parametrize("all_top_k", [False, True], ids=["mixed", "top_k_everywhere"])
def test_greedy_and_seeded_rows_get_the_tokens_of_the_one_row_at_a_time_sampler(quantized, all_top_k):
    rng = random.Random(f"{quantized}{all_top_k}")
    checked = 0
    for trial in range(8):
        rows = [random_row(rng, all_top_k) for _ in range(16)]
        logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(trial)) * 3
        if quantized:
            logits = torch.round(logits * 2) / 2
        expected = reference_sample(logits, rows, torch.Generator().manual_seed(0))
        got = sample(rows, logits)
        for i, row in enumerate(rows):
            if row.params.is_greedy or row.params.seed is not None:
                assert got[i] == expected[i], (trial, i, row.params)
                checked += 1
    assert checked > 60


def test_min_tokens_ban_stop_and_eos_ids_until_reached():
    logits = torch.zeros(3, 8)
    logits[:, 5] = 3.0
    logits[:, 1] = 2.0
    stop = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[5])
    ignore_eos = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=[5], ignore_eos=True)
    rows = [Row(stop, [0], [4]), Row(stop, [0], [4, 4]), Row(ignore_eos, [0], [])]
    # Row 0 is short of min_tokens: 5 and EOS 1 are banned; row 1 has reached it; row 2 ignores EOS.
    assert sample(rows, logits) == [0, 5, 1]


def test_seeded_row_gets_the_same_token_alone_or_in_any_batch():
    rng = random.Random(3)
    seeded = Row(SamplingParams(temperature=0.9, top_p=0.8, seed=42), [5, 6], [7, 8, 9])
    logits = torch.randn(1, VOCAB)
    alone = sample([seeded], logits)[0]
    for trial in range(4):
        others = [random_row(rng, all_top_k=trial % 2 == 0) for _ in range(5)]
        position = rng.randrange(6)
        batch = others[:position] + [seeded] + others[position:]
        batch_logits = torch.randn(len(batch), VOCAB)
        batch_logits[position] = logits[0]
        assert sample(batch, batch_logits, seed=trial)[position] == alone


@pytest.mark.parametrize("vocab,top_k", [(8, 5), (VOCAB, 6)], ids=["full_vocab_draw", "candidate_draw"])
def test_unseeded_rows_follow_the_filtered_distribution(vocab, top_k):
    params = SamplingParams(temperature=0.7, top_k=top_k, top_p=0.95, min_p=0.02)
    row_logits = torch.randn(vocab, generator=torch.Generator().manual_seed(1)) * 1.5
    expected = reference_filtered_probs(row_logits, params).double()
    expected /= expected.sum()
    num_rows, num_calls = 2000, 10
    metadata = batch_of([Row(params, [0], [])] * num_rows, vocab).metadata(range(num_rows))
    sampler = Sampler(seed=11)
    drawn = torch.cat([torch.tensor(sampler.sample(row_logits.repeat(num_rows, 1), metadata).token_ids)
                       for _ in range(num_calls)])
    counts = torch.bincount(drawn, minlength=vocab).double()
    possible = expected > 0
    assert counts[~possible].sum() == 0
    n = num_rows * num_calls
    chi_square = float(((counts[possible] - n * expected[possible]) ** 2 / (n * expected[possible])).sum())
    df = int(possible.sum()) - 1
    assert df >= 2 and chi_square < df + 6 * math.sqrt(2 * df), (chi_square, df)


def test_logprobs_are_those_of_the_raw_logits_before_penalties_and_temperature():
    rows = [Row(SamplingParams(temperature=0, logprobs=5, repetition_penalty=1.8), [3, 4], [5]),
            Row(SamplingParams(temperature=0.5, top_k=3, seed=1, logprobs=0, min_tokens=3), [3], []),
            Row(SamplingParams(temperature=1.2), [3], []),
            Row(SamplingParams(temperature=0.8, logprobs=2, presence_penalty=1.0), [3], [9, 9])]
    logits = torch.randn(len(rows), 64)
    reference = torch.log_softmax(logits.double(), dim=-1)
    out = Sampler(0).sample(logits.clone(), batch_of(rows, 64).metadata(range(len(rows))))
    assert out.logprobs[2] is None
    for i in (0, 1, 3):
        entry, n = out.logprobs[i], rows[i].params.logprobs
        assert entry.sampled_token_id == out.token_ids[i]
        assert entry.sampled_logprob == pytest.approx(float(reference[i, out.token_ids[i]]), abs=1e-5)
        assert entry.top_token_ids == reference[i].topk(n).indices.tolist()
        assert entry.top_logprobs == pytest.approx(reference[i].topk(n).values.tolist(), abs=1e-5)


def test_a_step_without_rows_to_sample_gives_nothing():
    # Every scheduled request may be mid-prompt: the runner then samples zero rows.
    assert Sampler(0).sample(torch.zeros(0, VOCAB), SamplingBatch(4, VOCAB).metadata([])) == ([], [])


@pytest.mark.parametrize("top_k", [0, 5], ids=["full_vocab", "candidates"])
def test_a_row_with_nothing_to_draw_from_gets_its_argmax_and_the_others_keep_their_tokens(top_k):
    # top_p 1e-300 is 0 in float32 and drops every token; repetition_penalty 1e-300 divides the positive
    # logit of prompt token 7 by 0, and softmax of inf is NaN. Either row used to get token 0.
    underflow = SamplingParams(temperature=0.8, top_k=top_k, top_p=1e-300)
    underflow_seeded = SamplingParams(temperature=0.8, top_k=top_k, top_p=1e-300, seed=5)
    nan = SamplingParams(temperature=0.8, top_k=top_k, repetition_penalty=1e-300, seed=6)
    normal = SamplingParams(temperature=0.8, top_k=top_k, seed=7)
    rows = [Row(underflow, [9], []), Row(underflow_seeded, [9], []), Row(nan, [7], []), Row(normal, [9], [])]
    logits = torch.randn(len(rows), VOCAB, generator=torch.Generator().manual_seed(2))
    logits[:, 3], logits[:, 7] = 30.0, 2.0
    got = sample(rows, logits)
    assert got[:3] == [3, 3, 7]
    assert [got[3]] == sample(rows[3:], logits[3:]) == reference_sample(logits[3:], rows[3:], torch.Generator())


@pytest.mark.parametrize("width", [262_144, 2048, 1000])
def test_argmax_is_the_first_index_of_each_rows_maximum_as_torch_argmax(width):
    torch.manual_seed(width)
    values = torch.randn(6, width)
    values[1, width // 3] = values[1, width // 2] = 50.0  # tied maxima in different chunks: the first wins
    values[2, 7] = values[2, 8] = 50.0  # ... and in one chunk
    values[3] = 0.0  # every element equal
    values[4, width - 1] = float("nan")  # NaN is the maximum, as for torch
    values[5, 0] = float("inf")
    assert argmax(values).tolist() == values.argmax(dim=-1).tolist()
