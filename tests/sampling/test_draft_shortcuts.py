"""Shortcuts of speculative decoding on the greedy path: a proposer over part of the vocabulary proposes what it
would over the whole without writing the full rows, and verifying on the target's argmax alone keeps what
verifying on its logits keeps."""
from __future__ import annotations

import pytest
import torch

from jido.core.sampling_params import SamplingParams
from jido.sampling.batch import SamplingBatch
from jido.sampling.draft_vocab import DraftVocab
from jido.sampling.metadata import SamplingMetadata, shift_metadata
from jido.sampling.rejection_sampler import Drafts, RejectionSampler, sample_draft, sample_draft_chain
from jido.sampling.sampler import Sampler, argmax

VOCAB_SIZE, DRAFT_SIZE, ROWS = 4096, 300, 64


def _vocab(seed: int) -> DraftVocab:
    """A random subset of the ids in random order, as a draft trained on frequencies holds them."""
    ids = torch.randperm(VOCAB_SIZE, generator=torch.Generator().manual_seed(seed))[:DRAFT_SIZE]
    return DraftVocab(ids, VOCAB_SIZE)


def _logits_with_ties_nans_and_empty_rows(seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(ROWS, DRAFT_SIZE, generator=g).round(decimals=1)  # coarse values: many ties
    logits[1, :] = 2.0  # every column tied
    logits[2, torch.randint(DRAFT_SIZE, (3,), generator=g)] = float("nan")
    logits[3, :] = float("-inf")  # nothing visible: the full row is all -inf too
    logits[4, :] = float("nan")
    logits[5, ::2] = float("-inf")
    logits[6, 7] = float("inf")
    logits[6, 200] = float("inf")
    return logits


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("kind", ["one maximum a row", "ties, NaNs and empty rows"])
def test_greedy_ids_are_the_argmax_of_the_full_rows(seed, kind):
    vocab = _vocab(seed)
    if kind == "one maximum a row":
        logits = torch.randn(ROWS, DRAFT_SIZE, generator=torch.Generator().manual_seed(seed))
    else:
        logits = _logits_with_ties_nans_and_empty_rows(seed)
    expected = argmax(vocab.full_logits(logits))
    assert torch.equal(vocab.greedy_ids(logits), expected)
    assert torch.equal(expected, vocab.full_logits(logits).argmax(dim=-1))  # the sampler's argmax is ATen's


def test_full_logits_put_the_drafts_values_at_their_ids_and_minus_inf_elsewhere():
    vocab = _vocab(9)
    logits = torch.randn(2, DRAFT_SIZE, dtype=torch.bfloat16)
    full = vocab.full_logits(logits)
    assert full.dtype == torch.float32 and full.shape == (2, VOCAB_SIZE)
    assert torch.equal(full[:, vocab.ids], logits.float())
    outside = torch.ones(VOCAB_SIZE, dtype=torch.bool)
    outside[vocab.ids] = False
    assert bool((full[:, outside] == float("-inf")).all())


def _metadata(params: list[SamplingParams]) -> SamplingMetadata:
    batch = SamplingBatch(len(params), VOCAB_SIZE)
    for row, p in enumerate(params):
        batch.add_request(row, p, [1, 2, 3], [], ())
    return batch.metadata(list(range(len(params))))


@pytest.mark.parametrize("params", [
    [SamplingParams(temperature=0)] * 4,  # the shortcut
    [SamplingParams(temperature=0, repetition_penalty=1.3)] * 4,  # penalties read the full rows
    [SamplingParams(temperature=0), SamplingParams(temperature=0.7, seed=3), SamplingParams(temperature=0.9,
                                                                                        top_p=0.8, seed=5),
     SamplingParams(temperature=0)],
], ids=["greedy", "greedy with a penalty", "mixed"])
def test_sample_draft_over_a_draft_vocabulary_draws_what_it_draws_over_the_full_rows(params):
    vocab = _vocab(4)
    logits = torch.randn(len(params), DRAFT_SIZE, generator=torch.Generator().manual_seed(2)) * 3
    logits[:, vocab.ids.argsort()[:5]] += 4  # draft ids 1, 2, 3 among the likely ones: the penalty matters
    md = _metadata(params)
    ids, q = sample_draft(Sampler(7), logits.clone(), md, vocab)
    full_ids, full_q = sample_draft(Sampler(7), vocab.full_logits(logits), md)
    assert ids == full_ids
    assert (q is None) == (full_q is None) and (q is None or torch.equal(q, full_q))
    assert all(i in set(vocab.ids.tolist()) for i in ids)


def test_verifying_on_the_targets_argmax_accepts_and_emits_what_verifying_on_its_logits_does():
    g = torch.Generator().manual_seed(11)
    lengths = [0, 1, 3, 4, 2, 4]
    rows = sum(n + 1 for n in lengths)
    logits = torch.randn(rows, 50, generator=g)
    target = logits.argmax(dim=-1).tolist()
    drafts, row = [], 0
    for i, n in enumerate(lengths):
        # Request i's proposals match the target's tokens up to its (i % 3)-th, then follow noise.
        ids = [target[row + j] if j < i % 3 else int(torch.randint(50, (1,), generator=g)) for j in range(n)]
        drafts.append(ids)
        row += n + 1
    md = shift_metadata(_metadata([SamplingParams(temperature=0)] * len(lengths)),
                        [i for i, n in enumerate(lengths) for _ in range(n + 1)],
                        [ids[:j] for ids in drafts for j in range(len(ids) + 1)])
    sampler = RejectionSampler(Sampler(0))
    expected = sampler.verify(logits.clone(), md, Drafts.deterministic(drafts))
    ours = sampler.verify_argmax(logits.argmax(dim=-1), Drafts.deterministic(drafts))
    assert ours == expected
    assert [len(t) for t in ours.token_ids] != [n + 1 for n in lengths]  # some proposals were rejected
    assert any(len(t) > 1 for t in ours.token_ids)  # and some held


class _ChainProposer:
    """A proposer whose next logits depend on every token proposed before them in its row (a hash of the chain)."""

    def __init__(self, rows: int, kernel: bool) -> None:
        self.rows, self.kernel, self.logits_calls = rows, kernel, 0

    def logits_of(self, chains: list[list[int]]) -> torch.Tensor:
        self.logits_calls += 1
        seeds = [hash(tuple(c)) % 2**31 for c in chains]
        return torch.stack([torch.randn(DRAFT_SIZE, generator=torch.Generator().manual_seed(s)) for s in seeds])

    def greedy_of(self, chains: list[list[int]]) -> torch.Tensor | None:
        if not self.kernel:
            return None
        columns = torch.stack([torch.randn(DRAFT_SIZE, generator=torch.Generator().manual_seed(
            hash(tuple(c)) % 2**31)) for c in chains]).argmax(dim=-1)
        return _vocab(4).ids[columns]

    @staticmethod
    def advance(chains: list[list[int]], ids: list[int]) -> list[list[int]]:
        return [c + [t] for c, t in zip(chains, ids)]


@pytest.mark.parametrize("kernel", [False, True], ids=["from the logits", "from the proposer's argmax kernel"])
def test_a_greedy_chain_proposes_each_positions_argmax_after_the_proposals_before_it(kernel):
    vocab, rows, k = _vocab(4), 3, 4
    md = _metadata([SamplingParams(temperature=0)] * rows)
    proposer = _ChainProposer(rows, kernel)
    drafts = sample_draft_chain(Sampler(0), md, k, [[r] for r in range(rows)], proposer.logits_of, proposer.advance,
                                vocab, proposer.greedy_of)
    chains = [[r] for r in range(rows)]  # one position at a time, as the general path draws them
    for j in range(k):
        logits = _ChainProposer(rows, False).logits_of(chains)
        ids, _ = sample_draft(Sampler(0), logits, shift_metadata(md, list(range(rows)), [c[1:] for c in chains]), vocab)
        chains = [c + [t] for c, t in zip(chains, ids)]
    assert drafts.token_ids == [c[1:] for c in chains] and drafts.probs == [None] * rows
    assert proposer.logits_calls == (0 if kernel else k)
    assert len({tuple(t) for t in drafts.token_ids}) > 1
