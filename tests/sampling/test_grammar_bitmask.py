"""Grammar bitmasks in the sampler: masked tokens get -inf, and greedy and random rows only ever pick allowed tokens."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from jido.core.sampling_params import SamplingParams
from jido.sampling.batch import SamplingBatch
from jido.sampling.filters import apply_token_bitmask
from jido.sampling.metadata import with_grammar
from jido.sampling.sampler import Sampler, argmax_under_grammar

VOCAB = 100  # not a multiple of 32: the last word's high bits lie past the logits


def bitmask_of(allowed: list[set[int]], vocab: int = VOCAB) -> np.ndarray:
    """The reference packing: bit t % 32 of word t // 32 set for each allowed t."""
    words = np.zeros((len(allowed), (vocab + 31) // 32), dtype=np.uint32)
    for row, tokens in enumerate(allowed):
        for t in tokens:
            words[row, t // 32] |= np.uint32(1 << (t % 32))
    return words.view(np.int32)


def test_apply_token_bitmask_sets_exactly_the_disallowed_tokens_of_the_masked_rows_to_minus_inf():
    rng = np.random.default_rng(0)
    allowed = [set(rng.choice(VOCAB, size=k, replace=False).tolist()) for k in (1, 7, 63)]
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(0))
    expected = logits.clone()
    for row, tokens in zip([0, 2, 3], allowed):
        for t in range(VOCAB):
            if t not in tokens:
                expected[row, t] = float("-inf")
    apply_token_bitmask(logits, torch.tensor([0, 2, 3]), torch.from_numpy(bitmask_of(allowed)))
    assert torch.equal(logits, expected)


def _metadata(params: list[SamplingParams]):
    batch = SamplingBatch(len(params), VOCAB)
    for slot, p in enumerate(params):
        batch.add_request(slot, p, [5, 6], [], (1,))
    return batch.metadata(range(len(params)))


def test_greedy_and_random_rows_pick_only_allowed_tokens_and_unconstrained_rows_are_untouched():
    params = [SamplingParams(temperature=0), SamplingParams(temperature=1.0, seed=7),
              SamplingParams(temperature=1.0), SamplingParams(temperature=0)]
    allowed = {"a": {3, 40, 99}, "b": {17, 64}, "c": {2}}
    req_ids = ["a", "b", "c", "free"]
    masks = dict(zip(allowed, bitmask_of(list(allowed.values()))))
    for trial in range(20):
        logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(trial)) * 4
        md = with_grammar(_metadata(params), req_ids, masks)
        assert not md.argmax_only  # the LM head's argmax shortcut would skip the masks
        tokens = Sampler(trial).sample(logits.clone(), md).token_ids
        assert tokens[0] in allowed["a"] and tokens[1] in allowed["b"] and tokens[2] in allowed["c"]
        assert tokens[0] == max(allowed["a"], key=lambda t: logits[0, t])  # greedy: the best allowed token
        assert tokens[3] == int(logits[3].argmax())


def test_rows_without_a_grammar_leave_the_metadata_as_it_was():
    md = with_grammar(_metadata([SamplingParams(temperature=0)]), ["x"], {})
    assert md.grammar_rows is None and md.argmax_only


def test_a_request_verifying_proposals_gets_one_mask_per_row_in_its_rows_only():
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0)]
    md = SamplingBatch(2, VOCAB)
    for slot, p in enumerate(params):
        md.add_request(slot, p, [5, 6], [], (1,))
    # "free" verifies one proposal (rows 0-1), "a" verifies two (rows 2-4) under three masks.
    md = md.metadata([0, 0, 1, 1, 1])
    allowed = [{3}, {40, 41}, {99}]
    md = with_grammar(md, ["free", "a"], {"a": bitmask_of(allowed)}, num_rows=[2, 3])
    assert md.grammar_rows.tolist() == [2, 3, 4]
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(0))
    tokens = Sampler(0).sample(logits.clone(), md).token_ids
    assert tokens[2] == 3 and tokens[3] in allowed[1] and tokens[4] == 99
    assert tokens[:2] == logits[:2].argmax(-1).tolist()


def test_a_request_whose_masks_do_not_match_its_rows_is_an_error_not_a_shifted_mask():
    md = _metadata([SamplingParams(temperature=0)])
    with pytest.raises(ValueError, match="samples 1 rows but has 2 grammar bitmasks"):
        with_grammar(md, ["a"], {"a": bitmask_of([{1}, {2}])})


def test_the_argmax_under_grammar_is_the_samplers_greedy_token_and_makes_logits_only_where_the_argmax_is_banned():
    params = [SamplingParams(temperature=0)] * 4
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(3))
    best = logits.argmax(-1).tolist()
    # "a" allows its argmax, "b" bans it, "free" has no grammar, "c" allows one token past the logits' best.
    allowed = {"a": {best[0], 7}, "b": {t for t in range(VOCAB) if t != best[1]}, "c": {99}}
    req_ids = ["a", "b", "free", "c"]
    md = with_grammar(_metadata(params), req_ids, dict(zip(allowed, bitmask_of(list(allowed.values())))))
    assert md.argmax_under_grammar and not md.argmax_only
    asked = []

    def logits_of(rows: torch.Tensor) -> torch.Tensor:
        asked.append(rows.tolist())
        return logits[rows].clone()

    tokens = argmax_under_grammar(logits.argmax(-1), md, logits_of)
    assert tokens.tolist() == Sampler(0).sample(logits.clone(), md).token_ids  # the masked logits' greedy tokens
    assert asked == [[1, 3]]  # only the rows whose argmax their grammar bans


def test_logprobs_or_a_random_row_need_the_full_logits_under_a_grammar():
    masks = {"a": bitmask_of([{1}])[0]}
    for params in (SamplingParams(temperature=0, logprobs=1), SamplingParams(temperature=1.0)):
        assert not with_grammar(_metadata([params]), ["a"], masks).argmax_under_grammar
