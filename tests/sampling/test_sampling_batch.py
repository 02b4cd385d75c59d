"""The persistent sampling batch and its token counts: patched step by step, they equal a rebuild from scratch."""
from __future__ import annotations

import random

import pytest
import torch

from jido.core.sampling_params import SamplingParams
from jido.sampling.batch import SamplingBatch
from jido.sampling.metadata import SamplingMetadata, TokenCounts

VOCAB = 50
PENALIZED = SamplingParams(repetition_penalty=1.3, frequency_penalty=0.5)


def test_token_counts_updated_incrementally_equal_a_bincount_from_scratch():
    rng = random.Random(0)
    counts = TokenCounts(num_rows=6, vocab_size=VOCAB)
    history: dict[int, tuple[list[int], list[int]]] = {}
    for step in range(60):
        free = [r for r in range(6) if r not in history]
        if free and rng.random() < 0.3:
            row = rng.choice(free)
            # ids >= VOCAB are tokenizer entries the logits lack: ignored.
            prompt = [rng.randrange(VOCAB + 5) for _ in range(rng.randint(0, 12))]
            output = [rng.randrange(VOCAB) for _ in range(rng.randint(0, 4))]
            counts.set_row(row, prompt, output)
            history[row] = (prompt, output)
        elif free and history and rng.random() < 0.2:
            src, dst = rng.choice(list(history)), rng.choice(free)
            counts.move_row(src, dst)
            history[dst] = history.pop(src)
        if history:
            rows = rng.sample(list(history), rng.randint(1, len(history)))
            new = [rng.randrange(VOCAB) for _ in rows]
            counts.add_output_tokens(torch.tensor(rows), torch.tensor(new))
            for row, token_id in zip(rows, new):
                history[row][1].append(token_id)
        for row, (prompt, output) in history.items():
            expected_mask = torch.bincount(torch.tensor([t for t in prompt if t < VOCAB], dtype=torch.long),
                                           minlength=VOCAB) > 0
            assert torch.equal(counts.prompt_mask[row], expected_mask), (step, row)
            assert torch.equal(counts.output_counts[row],
                               torch.bincount(torch.tensor(output, dtype=torch.long), minlength=VOCAB).int())


def test_token_counts_are_allocated_only_once_a_request_has_penalties():
    batch = SamplingBatch(max_num_seqs=4, vocab_size=VOCAB)
    batch.add_request(0, SamplingParams(temperature=0.7, top_k=5), [1, 2], [], (1,))
    batch.append_tokens([0], torch.tensor([3]))
    assert not batch.token_counts.allocated and batch.metadata([0]).no_penalties
    batch.add_request(1, PENALIZED, [1, 2], [4], (1,))
    assert batch.token_counts.allocated and batch.token_counts.output_counts.shape == (4, VOCAB)


def test_patched_batch_gives_the_metadata_of_one_built_from_scratch():
    rng = random.Random(1)
    batch = SamplingBatch(max_num_seqs=8, vocab_size=VOCAB)
    live: dict[int, tuple[SamplingParams, list[int], list[int]]] = {}  # slot -> params, prompt, output
    for step in range(40):
        free = [s for s in range(8) if s not in live]
        if free and rng.random() < 0.5:
            slot, params = free[0], random_params(rng)
            prompt, output = [rng.randrange(VOCAB) for _ in range(5)], [rng.randrange(VOCAB) for _ in range(2)]
            batch.add_request(slot, params, prompt, output, (1, 2))
            live[slot] = (params, prompt, list(output))
        if live and rng.random() < 0.2:
            gone = rng.choice(list(live))
            batch.remove_request(gone)
            del live[gone]
        if live and max(live) >= len(live):  # condense: move the last request into the first hole
            hole = min(s for s in range(8) if s not in live)
            batch.move_request(max(live), hole)
            live[hole] = live.pop(max(live))
        slots = sorted(live, key=lambda _: rng.random())  # a step samples its rows in any order
        if not slots:
            continue
        new = [rng.randrange(VOCAB) for _ in slots]
        batch.append_tokens(slots, torch.tensor(new))
        for slot, token_id in zip(slots, new):
            live[slot][2].append(token_id)
        assert_same_metadata(batch.metadata(slots), rebuilt([live[s] for s in slots]).metadata(range(len(slots))))


def test_metadata_flags_describe_random_rows_only():
    batch = SamplingBatch(max_num_seqs=3, vocab_size=VOCAB)
    batch.add_request(0, SamplingParams(temperature=0, top_k=5, top_p=0.5, min_p=0.1), [1], [], (1,))
    batch.add_request(1, SamplingParams(temperature=0.5, top_p=0.9), [1], [], (1,))
    greedy = batch.metadata([0])
    assert greedy.all_greedy and greedy.no_top_k and greedy.no_top_p and greedy.no_min_p
    both = batch.metadata([0, 1])
    assert not both.all_greedy and not both.all_random and both.no_top_k and not both.no_top_p
    assert batch.metadata([1]).all_random


def test_counts_must_come_for_exactly_the_rows_with_penalties():
    batch = SamplingBatch(max_num_seqs=2, vocab_size=VOCAB)
    batch.add_request(0, PENALIZED, [1], [], (1,))
    fields = {name: column[:2] for name, column in batch.columns.items()}
    with pytest.raises(ValueError, match=r"prompt_token_mask must have one row per row with penalties \(1\), got 2"):
        SamplingMetadata(**fields, stop_token_ids=[(), ()], prompt_token_mask=torch.zeros(2, VOCAB, dtype=torch.bool),
                         output_token_counts=torch.zeros(1, VOCAB, dtype=torch.int32))


def random_params(rng: random.Random) -> SamplingParams:
    return SamplingParams(
        temperature=rng.choice([0.0, 0.8]), top_k=rng.choice([0, 7]), top_p=rng.choice([1.0, 0.9]),
        min_p=rng.choice([0.0, 0.05]), repetition_penalty=rng.choice([1.0, 1.2]),
        presence_penalty=rng.choice([0.0, 0.4]), frequency_penalty=rng.choice([0.0, -0.3]),
        seed=rng.choice([None, 7, -3]), min_tokens=rng.choice([0, 3]), stop_token_ids=rng.choice([None, [9, VOCAB]]),
        ignore_eos=rng.random() < 0.5, logprobs=rng.choice([None, 0, 3]))


def rebuilt(requests: list[tuple[SamplingParams, list[int], list[int]]]) -> SamplingBatch:
    batch = SamplingBatch(len(requests), VOCAB)
    for slot, (params, prompt, output) in enumerate(requests):
        batch.add_request(slot, params, prompt, output, (1, 2))
    return batch


def assert_same_metadata(got: SamplingMetadata, expected: SamplingMetadata) -> None:
    for name, value in vars(expected).items():
        other = getattr(got, name)
        if isinstance(value, torch.Tensor):
            assert torch.equal(other, value), name
        else:
            assert other == value, name
