"""Rejection sampling keeps the target's distribution at every position, for any proposer, and accepts optimally.

A synthetic target and draft whose distributions at position j do not depend on the tokens before it: then
the token emitted at position j must follow the target's (filtered) p_j whatever happened before, and the
first proposal must hold with probability sum_x min(p_0(x), q_0(x)), the most any exact rule achieves.
"""
from __future__ import annotations

import pytest
import torch
from distribution_checks import MIN_P_VALUE, chi_square_p_value
from reference_sampler import reference_filtered_probs

from jido.core.sampling_params import SamplingParams
from jido.sampling import rejection_sampler
from jido.sampling.batch import SamplingBatch
from jido.sampling.metadata import SamplingMetadata, shift_metadata
from jido.sampling.rejection_sampler import Drafts, RejectionSampler, sample_draft
from jido.sampling.sampler import Sampler

VOCAB, K, NUM_REQUESTS = 8, 3, 20000
SETTINGS = {"temperature 1": SamplingParams(temperature=1.0), "temperature 0.7": SamplingParams(temperature=0.7),
            "top-p 0.9": SamplingParams(temperature=0.7, top_p=0.9)}


def _metadata(params: SamplingParams, num: int) -> SamplingMetadata:
    """``num`` rows of one request's settings (copies of its row)."""
    batch = SamplingBatch(1, VOCAB)
    batch.add_request(0, params, [0], [], ())
    return shift_metadata(batch.metadata([0]), [0] * num, [[]] * num)


def _logits(seed: int, scale: float) -> torch.Tensor:
    return torch.randn(K + 1, VOCAB, generator=torch.Generator().manual_seed(seed)) * scale


def _propose(sampler: Sampler, md: SamplingMetadata, draft_logits: torch.Tensor) -> Drafts:
    """K proposals per request, each drawn by the draft path from its position's draft logits."""
    num = md.num_rows
    tokens: list[list[int]] = [[] for _ in range(num)]
    probs = []
    for j in range(K):
        shifted = shift_metadata(md, list(range(num)), tokens)
        ids, q = sample_draft(sampler, draft_logits[j].expand(num, VOCAB).clone(), shifted)
        probs.append(q)
        for row, token_id in enumerate(ids):
            tokens[row].append(token_id)
    q_rows = None if probs[0] is None else torch.stack(probs, dim=1)  # [num, K, vocab]
    return Drafts(tokens, [None if q_rows is None else q_rows[i] for i in range(num)])


def _verify(sampler: Sampler, md: SamplingMetadata, target_logits: torch.Tensor, drafts: Drafts) -> list[list[int]]:
    sources = [i for i, ids in enumerate(drafts.token_ids) for _ in range(len(ids) + 1)]
    prefixes = [ids[:j] for ids in drafts.token_ids for j in range(len(ids) + 1)]
    rows = torch.cat([target_logits[:len(ids) + 1] for ids in drafts.token_ids])
    return RejectionSampler(sampler).verify(rows, shift_metadata(md, sources, prefixes), drafts).token_ids


def _run(params: SamplingParams, num: int = NUM_REQUESTS, seed: int = 0) -> tuple[list[list[int]], Drafts]:
    sampler = Sampler(seed)
    md = _metadata(params, num)
    drafts = _propose(sampler, md, _logits(1, 1.2)[:K] + _logits(2, 0.9)[:K])
    return _verify(sampler, md, _logits(1, 1.2), drafts), drafts


def _position_p_values(tokens: list[list[int]], params: SamplingParams) -> list[float]:
    target = _logits(1, 1.2)
    p_values = []
    for j in range(K + 1):
        emitted = torch.tensor([t[j] for t in tokens if len(t) > j])
        probs = reference_filtered_probs(target[j].clone(), params)
        p_values.append(chi_square_p_value(torch.bincount(emitted, minlength=VOCAB), probs / probs.sum()))
    return p_values


@pytest.mark.parametrize("name", SETTINGS)
def test_every_position_follows_the_target_distribution_and_the_first_proposal_holds_optimally(name):
    params = SETTINGS[name]
    tokens, drafts = _run(params)
    assert min(_position_p_values(tokens, params)) > MIN_P_VALUE
    assert sum(len(t) == K + 1 for t in tokens) > 1000  # every position, the bonus one too, was reached often
    p0 = reference_filtered_probs(_logits(1, 1.2)[0].clone(), params)
    q0 = drafts.probs[0][0]
    expected = float(torch.minimum(p0 / p0.sum(), q0).sum())
    rate = sum(len(t) > 1 for t in tokens) / len(tokens)
    assert abs(rate - expected) < 4.5 * (expected * (1 - expected) / len(tokens)) ** 0.5, (rate, expected)


@pytest.mark.parametrize("bias", ["lenient acceptance", "resample from p"])
def test_the_distribution_check_catches_a_subtly_wrong_rule(monkeypatch, bias):
    params = SETTINGS["temperature 0.7"]
    if bias == "lenient acceptance":  # accept with min(1, p / (0.9 q)): a tenth too often where p < q
        uniform = RejectionSampler._uniform
        monkeypatch.setattr(RejectionSampler, "_uniform", lambda self, *a: uniform(self, *a) * 0.9)
    else:  # replace a rejected proposal by a draw from p instead of from max(0, p - q)
        monkeypatch.setattr(rejection_sampler, "_residual", lambda p, q: p.clone())
    tokens, _ = _run(params)
    assert min(_position_p_values(tokens, params)) < MIN_P_VALUE


def test_greedy_accepts_while_the_argmax_matches_and_then_takes_the_argmax():
    params = SamplingParams(temperature=0)
    target = _logits(1, 1.2)
    md = _metadata(params, 3)
    proposals = [target[:K].argmax(-1).tolist(), [target[0].argmax().item(), (target[1].argmax().item() + 1) % VOCAB,
                                                  0], [(target[0].argmax().item() + 1) % VOCAB]]
    tokens = _verify(Sampler(0), md, target, Drafts.deterministic(proposals))
    argmax = target.argmax(-1).tolist()
    assert tokens == [argmax, argmax[:2], argmax[:1]]


@pytest.mark.parametrize("name", SETTINGS)
def test_point_mass_proposals_give_a_seeded_request_the_tokens_it_gets_one_step_at_a_time(name):
    params = SamplingParams(temperature=SETTINGS[name].temperature, top_p=SETTINGS[name].top_p, seed=7)
    target = _logits(1, 1.2)
    # One position at a time: the sampler at output positions 0, 1, 2, ... (the model ignores the prefix).
    one_by_one = []
    for j in range(K + 1):
        md = shift_metadata(_metadata(params, 1), [0], [one_by_one])
        one_by_one += Sampler(0).sample(target[j:j + 1].clone(), md).token_ids
    # Proposing exactly those tokens accepts them all; proposing a wrong second one replaces it by the right one.
    wrong = [one_by_one[0], (one_by_one[1] + 1) % VOCAB, one_by_one[2]]
    md = _metadata(params, 2)
    tokens = _verify(Sampler(123), md, target, Drafts.deterministic([one_by_one[:K], wrong]))
    assert tokens == [one_by_one, one_by_one[:2]]


def test_seeded_requests_get_the_same_tokens_alone_or_in_any_batch():
    params = SamplingParams(temperature=0.8, seed=11)
    alone, _ = _run(params, num=1, seed=0)
    batched, _ = _run(params, num=5, seed=99)
    assert all(tokens == alone[0] for tokens in batched)


def test_logprobs_are_the_targets_raw_logprobs_of_the_emitted_tokens():
    params = SamplingParams(temperature=0.7, top_p=0.9, logprobs=2, seed=3)
    sampler = Sampler(0)
    md = _metadata(params, 1)
    target = _logits(1, 1.2)
    drafts = _propose(sampler, md, _logits(1, 1.2)[:K] + _logits(2, 0.9)[:K])
    rows = target[:K + 1].clone()
    verified = RejectionSampler(sampler).verify(rows, shift_metadata(md, [0] * (K + 1),
                                                                     [drafts.token_ids[0][:j] for j in range(K + 1)]),
                                                drafts)
    raw = torch.log_softmax(target, dim=-1)
    for j, (token_id, lp) in enumerate(zip(verified.token_ids[0], verified.logprobs[0])):
        assert lp.sampled_token_id == token_id
        assert lp.sampled_logprob == pytest.approx(float(raw[j, token_id]))
        assert lp.top_token_ids == raw[j].topk(2).indices.tolist()
