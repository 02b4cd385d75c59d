"""RejectionSampler: verifies proposed tokens against the target model, keeping exactly the target's distribution."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

import torch

from jido.core.outputs import Logprobs
from jido.sampling.draft_vocab import DraftVocab
from jido.sampling.filters import filtered_probs
from jido.sampling.metadata import SamplingMetadata, shift_metadata
from jido.sampling.sampler import (Sampler, apply_constraints, argmax, exponential_noise, logprobs_of, raw_logprobs,
                                   seeded_generator)

State = TypeVar("State")

# Streams of a seeded request's draws at one output position (stream 0 is the target's own token).
DRAFT_STREAM, ACCEPT_STREAM, RESIDUAL_STREAM = 1, 2, 3


@dataclass
class Drafts:
    """The proposals a step verifies, per request in batch order.

    ``probs[i]`` is the proposer's distribution q at each proposal, ``[K_i, vocab]`` float32 summing to 1,
    each row the one its token was drawn from; None where the proposal is deterministic (n-gram, or any
    greedy proposer): a point mass on the token.
    """

    token_ids: list[list[int]]
    probs: list[torch.Tensor | None]

    @classmethod
    def deterministic(cls, token_ids: list[list[int]]) -> Drafts:
        return cls(token_ids, [None] * len(token_ids))


class VerifiedTokens(NamedTuple):
    """Per request: the accepted proposals then one token of the target's, and the target's logprobs of each."""

    token_ids: list[list[int]]
    logprobs: list[list[Logprobs]]  # empty lists for requests that did not ask


class RejectionSampler:
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023) over a batch of K_i + 1 rows per request.

    Row ``j`` of request ``i`` holds the target's logits at the position after its first ``j`` proposals,
    with metadata shifted to match (:func:`jido.sampling.metadata.shift_metadata`): temperature, top-k/p,
    min-p, penalties and bans shape p there exactly as in a run without speculation, and the proposer
    applied the same settings to q. Proposal ``x`` at row ``j`` is accepted with probability
    ``min(1, p(x) / q(x))``; the first rejected one is replaced by a draw from ``normalize(max(0, p - q))``
    and the rest dropped; when all ``K_i`` hold, the last row gives a bonus token drawn from p.

    For a point mass q (n-gram, greedy) the rule fuses into one draw: the token t the target samples at
    the row (argmax for greedy rows) is compared with the proposal. ``P(t = x) = p(x) = min(1, p(x) / 1)``,
    and given ``t != x``, t follows p without x renormalised: ``normalize(max(0, p - q))``. Such a row
    draws exactly what a step without speculation draws at that position (a seeded request gets the very
    same tokens).
    """

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler

    def verify(self, logits: torch.Tensor, md: SamplingMetadata, drafts: Drafts) -> VerifiedTokens:
        """Accept or replace each request's proposals; ``logits`` ([R, vocab] float32, used up) as described above."""
        starts = _row_starts(drafts.token_ids)
        raw = raw_logprobs(logits, md)
        apply_constraints(logits, md)
        stochastic = self._stochastic_rows(drafts, md, starts)
        p = _normalized_probs(logits[stochastic.rows], md, stochastic.rows) if stochastic else None
        emitted = self.sampler.choose(logits, md)
        accepted = emitted.cpu() == _proposed(drafts)
        if stochastic:
            held, replacement = self._accept_or_replace(p, stochastic, md, emitted[stochastic.rows].cpu())
            accepted[stochastic.rows] = held
            emitted[stochastic.rows.to(emitted.device)] = torch.where(
                held.to(emitted.device), stochastic.token_ids.to(emitted.device), replacement.to(emitted.device))
        emitted_list = emitted.tolist()
        logprobs = logprobs_of(raw, emitted, emitted_list, md)
        return _assemble(drafts.token_ids, starts, accepted.tolist(), emitted_list, logprobs)

    def verify_argmax(self, token_ids: torch.Tensor, drafts: Drafts) -> VerifiedTokens:
        """:meth:`verify` where every row needs only the target's argmax (greedy, no penalties, bans or logprobs:
        ``md.argmax_only``), given as ``token_ids`` ([R]): each proposal holds while it is the target's token."""
        emitted = token_ids.cpu()
        return _assemble(drafts.token_ids, _row_starts(drafts.token_ids), (emitted == _proposed(drafts)).tolist(),
                         emitted.tolist(), [None] * emitted.numel())

    def _stochastic_rows(self, drafts: Drafts, md: SamplingMetadata, starts: list[int]) -> _StochasticRows | None:
        """The rows whose proposal came with a distribution q and that sample randomly (greedy rows compare)."""
        rows, tokens, q = [], [], []
        temperature = md.temperature.tolist()
        for start, ids, probs in zip(starts, drafts.token_ids, drafts.probs):
            if probs is None:
                continue
            for j, token_id in enumerate(ids):
                if temperature[start + j] > 0:
                    rows.append(start + j)
                    tokens.append(token_id)
                    q.append(probs[j])
        if not rows:
            return None
        return _StochasticRows(torch.tensor(rows), torch.tensor(tokens), torch.stack(q))

    def _accept_or_replace(self, p: torch.Tensor, rows: _StochasticRows, md: SamplingMetadata,
                           fallback: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per stochastic row: whether its proposal holds ([Q] bool), and the residual token to use if not.

        ``fallback`` is the target's own choice there, taken by rows whose p is empty (the sampler's
        argmax for a distribution it cannot draw from).
        """
        q = rows.q.to(p.device)
        index = rows.token_ids.to(p.device)[:, None]
        p_x, q_x = p.gather(1, index).flatten(), q.gather(1, index).flatten()
        uniform = self._uniform(md, rows.rows, p.device)
        held = uniform * q_x < p_x  # u < p / q, without dividing by a q(x) that rounding made 0
        replacement = self._draw(_residual(p, q), md, rows.rows).cpu()
        degenerate = ~(p.sum(-1) > 0).cpu()
        if bool(degenerate.any()):
            replacement = torch.where(degenerate, fallback, replacement)
            held = torch.where(degenerate.to(held.device), (rows.token_ids == fallback).to(held.device), held)
        return held.cpu(), replacement

    def _uniform(self, md: SamplingMetadata, rows: torch.Tensor, device: torch.device) -> torch.Tensor:
        values = torch.rand(rows.numel(), generator=self.sampler.generator, device=device)
        for i, row in _seeded(md, rows):
            generator = seeded_generator(int(md.seeds[row]), int(md.output_positions[row]), device, ACCEPT_STREAM)
            values[i] = torch.rand(1, generator=generator, device=device)
        return values

    def _draw(self, weights: torch.Tensor, md: SamplingMetadata, rows: torch.Tensor) -> torch.Tensor:
        """One token per row from unnormalised ``weights`` [Q, vocab] (Gumbel-max in its exponential form)."""
        noise = exponential_noise(weights, self.sampler.generator)
        for i, row in _seeded(md, rows):
            generator = seeded_generator(int(md.seeds[row]), int(md.output_positions[row]), weights.device,
                                         RESIDUAL_STREAM)
            noise[i] = exponential_noise(weights[i], generator)
        return argmax(weights / noise)


@dataclass
class _StochasticRows:
    rows: torch.Tensor  # [Q] rows of the batch
    token_ids: torch.Tensor  # [Q] the proposals there
    q: torch.Tensor  # [Q, vocab] their proposers' distributions


def sample_draft(sampler: Sampler, logits: torch.Tensor, md: SamplingMetadata,
                 vocab: DraftVocab | None = None) -> tuple[list[int], torch.Tensor | None]:
    """A proposer's tokens drawn from its own logits ([B, vocab], used up; over ``vocab``'s ids where given), and
    q for the random rows.

    Greedy rows take the argmax (a point mass: their q rows are meaningless and the caller keeps none);
    a seeded row draws from its own ``DRAFT_STREAM``, so the proposal is reproducible and independent of
    the target's draws.
    """
    if vocab is not None:
        if md.plain_greedy:  # a proposal reports no logprobs: nothing else reads the logits, so no full rows
            return vocab.greedy_ids(logits).tolist(), None
        logits = vocab.full_logits(logits)
    apply_constraints(logits, md)
    greedy_ids = argmax(logits)
    if md.all_greedy:
        return greedy_ids.tolist(), None
    q = _normalized_probs(logits, md, torch.arange(md.num_rows))
    noise = exponential_noise(q, sampler.generator)
    for row in md.has_seed.nonzero().flatten().tolist():
        generator = seeded_generator(int(md.seeds[row]), int(md.output_positions[row]), q.device, DRAFT_STREAM)
        noise[row] = exponential_noise(q[row], generator)
    # A row with nothing left to draw from (q all zero) proposes its argmax, as the sampler would choose,
    # and a greedy row its argmax: for both, q is the point mass on that token.
    drawable = (q.sum(-1) > 0) & (md.temperature > 0).to(q.device)
    token_ids = torch.where(drawable, argmax(q / noise), greedy_ids)
    point = (~drawable).nonzero().flatten()
    if point.numel():
        q[point] = 0.0
        q[point, token_ids[point]] = 1.0
    return token_ids.tolist(), q


def sample_draft_chain(sampler: Sampler, md: SamplingMetadata, k: int, state: State,
                       logits_of: Callable[[State], torch.Tensor],
                       advance: Callable[[State, list[int]], State], vocab: DraftVocab | None = None,
                       greedy_of: Callable[[State], torch.Tensor | None] | None = None) -> Drafts:
    """``k`` proposals per row of ``md``, each drawn (:func:`sample_draft`) after the ones before it: a proposer's
    ``state`` gives the logits of the next position (``logits_of``; over ``vocab``'s ids where given) and moves on
    past each row's new token (``advance``). Greedy rows keep no q.

    ``greedy_of`` gives the next position's argmax token ids ([B] int64) straight from the proposer's kernel,
    without logits, where it can (else None): taken where every row is plain greedy."""
    if md.plain_greedy:
        return _greedy_chain(sampler, md, k, state, logits_of, advance, vocab, greedy_of)
    rows = list(range(md.num_rows))
    tokens: list[list[int]] = [[] for _ in rows]
    probs: list[list[torch.Tensor]] = [[] for _ in rows]
    for j in range(k):
        ids, q = sample_draft(sampler, logits_of(state), shift_metadata(md, rows, tokens), vocab)
        for i, token_id in enumerate(ids):
            tokens[i].append(token_id)
            if q is not None:
                probs[i].append(q[i])
        if j + 1 < k:
            state = advance(state, ids)
    greedy = (md.temperature == 0).tolist()
    return Drafts(tokens, [None if greedy[i] or not probs[i] else torch.stack(probs[i]) for i in rows])


def _greedy_chain(sampler: Sampler, md: SamplingMetadata, k: int, state: State,
                  logits_of: Callable[[State], torch.Tensor], advance: Callable[[State, list[int]], State],
                  vocab: DraftVocab | None, greedy_of: Callable[[State], torch.Tensor | None] | None) -> Drafts:
    """:func:`sample_draft_chain` for plain greedy rows (no penalties, no bans): each proposal is its position's
    argmax, which no earlier proposal changes (output positions only move past bans), so ``md`` serves every
    position unshifted (shifting it cost a visible share of a proposal)."""
    tokens: list[list[int]] = [[] for _ in range(md.num_rows)]
    for j in range(k):
        ids = greedy_of(state) if greedy_of is not None else None
        new = ids.tolist() if ids is not None else sample_draft(sampler, logits_of(state), md, vocab)[0]
        for row, token_id in zip(tokens, new):
            row.append(token_id)
        if j + 1 < k:
            state = advance(state, new)
    return Drafts(tokens, [None] * md.num_rows)


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``max(0, p - q)`` per row ([Q, vocab]), unnormalised: what a rejected proposal's replacement is drawn from."""
    residual = (p - q).clamp_(min=0.0)
    # p <= q everywhere means p == q: such a row always holds, so whatever stands here is never used.
    empty = ~(residual.sum(-1) > 0)
    residual[empty] = p[empty]
    return residual


def _normalized_probs(logits: torch.Tensor, md: SamplingMetadata, rows: torch.Tensor) -> torch.Tensor:
    """Filtered probabilities of ``rows`` ([Q, vocab] ``logits`` of those rows, used up), each summing to 1."""
    temperature = md.temperature[rows].clamp(min=1e-5)  # a greedy row's q is never read; keep it finite
    top_k, top_p, min_p = md.top_k[rows], md.top_p[rows], md.min_p[rows]
    # A filter runs only when one of these rows uses it (the batch's flags speak of all its rows).
    probs = filtered_probs(logits, temperature, top_k if bool((top_k > 0).any()) else None,
                           top_p if bool((top_p < 1).any()) else None, min_p if bool((min_p > 0).any()) else None)
    full = probs.full_rows(torch.arange(rows.numel(), device=probs.values.device))
    total = full.sum(-1, keepdim=True)
    # A row with nothing left (all filtered or NaN) stays all zero: it can accept nothing and replaces by argmax.
    return torch.where(total > 0, full / total, torch.zeros_like(full))


def _seeded(md: SamplingMetadata, rows: torch.Tensor) -> list[tuple[int, int]]:
    """(index in ``rows``, batch row) for the seeded ones among ``rows``."""
    seeded = md.has_seed[rows]
    return [(i, int(rows[i])) for i in seeded.nonzero().flatten().tolist()]


def _row_starts(draft_token_ids: list[list[int]]) -> list[int]:
    starts, start = [], 0
    for ids in draft_token_ids:
        starts.append(start)
        start += len(ids) + 1
    return starts


def _proposed(drafts: Drafts) -> torch.Tensor:
    """Per verified row, the proposal it checks (-1 on each request's last row, which only samples)."""
    return torch.tensor([t for ids in drafts.token_ids for t in ids + [-1]], dtype=torch.long)


def _assemble(draft_token_ids: list[list[int]], starts: list[int], accepted: list[bool], emitted: list[int],
              logprobs: list[Logprobs | None]) -> VerifiedTokens:
    token_ids, token_logprobs = [], []
    for start, ids in zip(starts, draft_token_ids):
        num_accepted = next((j for j in range(len(ids)) if not accepted[start + j]), len(ids))
        end = start + num_accepted + 1
        token_ids.append(emitted[start:end])
        token_logprobs.append([lp for lp in logprobs[start:end] if lp is not None])
    return VerifiedTokens(token_ids, token_logprobs)
