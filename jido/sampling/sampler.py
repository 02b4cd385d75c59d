"""Sampler: turns the logits of a batch of rows into next tokens, each row with its own settings."""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from jido.core.outputs import Logprobs
from jido.sampling.filters import Probs, apply_penalties, apply_token_bitmask, ban_tokens, filtered_probs
from jido.sampling.metadata import SamplingMetadata

_SEED_MIX = 0x9E3779B97F4A7C15  # spreads (seed, position) pairs over the generator's seed space
_STREAM_MIX = 0xD1B54A32D192ED03  # and (seed, position, stream) triples, stream 0 keeping the pairs' seeds


_ARGMAX_CHUNK = 512  # columns per chunk of argmax's first pass


def argmax(values: torch.Tensor) -> torch.Tensor:
    """The index of each row's largest value (the first among equals), as ``values.argmax(dim=-1)``.

    ATen's max-with-index over a row is a scalar loop on one thread (``argmax`` too), while ``amax`` (values only)
    is vectorized and parallel, an order of magnitude faster over a large vocabulary. So the row's
    chunks of 512 are reduced by ``amax`` first, and the index is looked for in the first chunk holding the
    row's maximum only, which is where the first maximal element lies (a NaN propagates through both passes as
    through ``max``), several times faster than ``max`` over rows of 262,144.
    """
    rows, width = values.shape
    if width % _ARGMAX_CHUNK or width < 4 * _ARGMAX_CHUNK:
        return values.max(dim=-1).indices
    chunks = values.view(rows, width // _ARGMAX_CHUNK, _ARGMAX_CHUNK)
    best_chunk = chunks.amax(dim=-1).max(dim=-1).indices
    within = chunks[torch.arange(rows, device=values.device), best_chunk].max(dim=-1).indices
    return best_chunk * _ARGMAX_CHUNK + within


def exponential_noise(like: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Exp(1) noise of ``like``'s shape, dtype and device, drawn from ``generator``: ``-log U``, U ~ Uniform[0, 1).

    ``Tensor.exponential_`` would draw the same distribution, but on CPU it is several times slower than
    ``uniform_`` and ``log``, a large share of a batch-1 step at temperature > 0 over a large vocabulary.
    U = 0 gives infinite noise: that token's p / E is 0, as for any E far above the rest.
    """
    return torch.empty_like(like).uniform_(generator=generator).log_().neg_()


def argmax_under_grammar(token_ids: torch.Tensor, md: SamplingMetadata,
                         logits_of: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Each row's argmax under its grammar mask ([R] int64), given the rows' unmasked argmax ``token_ids`` ([R], used
    up) and ``logits_of(rows)``, the logits of some rows ([len(rows), vocab]).

    Where the unmasked argmax is allowed it is the masked argmax too, so only the rows whose grammar bans it need
    their logits (``md.argmax_under_grammar``): a grammar step keeps the LM head's argmax kernel for the rest.
    """
    rows, masks = md.grammar_rows, md.grammar_bitmask
    chosen = token_ids[rows.to(token_ids.device)].cpu()
    word = (chosen // 32).clamp(max=masks.shape[1] - 1)
    bit = (masks.gather(1, word[:, None]).flatten() >> (chosen % 32).to(torch.int32)) & 1
    allowed = (bit == 1) & (chosen < masks.shape[1] * 32)
    if bool(allowed.all()):
        return token_ids
    misses = rows[~allowed]
    logits = logits_of(misses)
    apply_token_bitmask(logits, torch.arange(misses.numel()), masks[~allowed])
    token_ids[misses.to(token_ids.device)] = argmax(logits).to(token_ids.device)
    return token_ids

class SamplerOutput(NamedTuple):
    """One token per row, and its logprobs where the row asked for them."""

    token_ids: list[int]
    logprobs: list[Logprobs | None]


class Sampler:
    """Greedy, temperature, top-k, top-p, min-p and penalties, with per-request seeds, for a whole batch at once.

    A seeded row draws its randomness from a generator seeded by (seed, output position), so the same
    seed gives the same tokens whatever else is in the batch and even after preemption and recompute:
    one noise draw over the row's full vocabulary, as when rows were sampled one by one, so a seeded
    request gets the very tokens it got then. Unseeded rows share the sampler's generator in one draw
    for all of them (over the candidates top-k kept, when every random row has top-k), so their tokens
    follow the same distribution as before but are not the same draws.
    """

    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(self.device)
        self.generator.manual_seed(seed)

    def sample(self, logits: torch.Tensor, metadata: SamplingMetadata) -> SamplerOutput:
        """Sample one token per row of ``logits`` ([B, vocab] float32), as ``metadata`` says.

        ``logits`` is used up: penalties, bans, grammar masks and temperature are applied to it in place.
        Logprobs are those of the raw model distribution, before any of them.
        """
        raw = raw_logprobs(logits, metadata)
        apply_constraints(logits, metadata)
        token_ids = self.choose(logits, metadata)
        token_id_list = token_ids.tolist()
        return SamplerOutput(token_id_list, logprobs_of(raw, token_ids, token_id_list, metadata))

    def choose(self, logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """One token per row ([B] int64) from logits the constraints were already applied to (used up)."""
        if md.all_greedy:
            return argmax(logits)
        if md.all_random:
            return self._sample_random(logits, md, None)
        rows = (md.temperature > 0).nonzero().flatten()
        index = rows.to(logits.device)
        token_ids = argmax(logits)  # one pass over every row beats gathering the greedy ones first
        token_ids[index] = self._sample_random(logits[index], md, rows)
        return token_ids

    def _sample_random(self, logits: torch.Tensor, md: SamplingMetadata, rows: torch.Tensor | None) -> torch.Tensor:
        """Draw for the random rows ``rows`` of the batch (None: all of them), whose logits are ``logits``."""
        def pick(values: torch.Tensor) -> torch.Tensor:
            return values if rows is None else values[rows]

        probs = filtered_probs(logits, pick(md.temperature), None if md.no_top_k else pick(md.top_k),
                               None if md.no_top_p else pick(md.top_p), None if md.no_min_p else pick(md.min_p))
        degenerate = _zero_degenerate_rows(probs)
        token_ids = self._draw(probs, pick(md.has_seed), pick(md.seeds), pick(md.output_positions))
        return token_ids if degenerate is None else torch.where(degenerate, argmax(logits), token_ids)

    def _draw(self, probs: Probs, has_seed: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One token per row: seeded rows each from their own generator, the others from the shared one at once."""
        unseeded = (~has_seed).nonzero().flatten()
        if unseeded.numel() == has_seed.numel():
            return self._draw_shared(probs)
        device = probs.values.device
        token_ids = torch.empty(has_seed.numel(), dtype=torch.long, device=device)
        if unseeded.numel():
            token_ids[unseeded.to(device)] = self._draw_shared(probs.select(unseeded.to(device)))
        seeded = has_seed.nonzero().flatten()
        for row, seed, position in zip(seeded.tolist(), seeds[seeded].tolist(), positions[seeded].tolist()):
            candidates = None if probs.token_ids is None else probs.token_ids[row]
            token_ids[row] = _draw_seeded(probs.values[row], candidates, probs.vocab_size, seed, position)
        return token_ids

    def _draw_shared(self, probs: Probs) -> torch.Tensor:
        # Gumbel-max in its exponential form: argmax(p / E) with E ~ Exp(1) draws from p, without a
        # cumulative sum. Tokens outside truncated probabilities have probability 0 and could never win.
        noise = exponential_noise(probs.values, self.generator)
        choice = argmax(probs.values / noise)
        return choice if probs.token_ids is None else probs.token_ids.gather(1, choice[:, None]).flatten()


def seeded_generator(seed: int, position: int, device: torch.device, stream: int = 0) -> torch.Generator:
    """The generator of a seeded request's draws at one output position; ``stream`` tells draws there apart.

    Stream 0 is the token's own draw (what the sampler has always used); speculative decoding draws a
    draft token, an acceptance test and a residual token at the same position from other streams, so no two
    of them share randomness.
    """
    generator = torch.Generator(device)
    generator.manual_seed((seed * _SEED_MIX + position + stream * _STREAM_MIX) % (2**63))
    return generator


def _draw_seeded(probs: torch.Tensor, token_ids: torch.Tensor | None, vocab_size: int, seed: int,
                 position: int) -> int:
    """One row's draw from its own generator: ``probs`` [vocab], or [n] for the vocabulary ids ``token_ids``."""
    # NOTE: a seeded row's tokens are a promise: the same generator seed and the same noise over the full
    # [vocab] float32 row as the one-row-at-a-time sampler drew, whatever part of it is looked at.
    generator = seeded_generator(seed, position, probs.device)
    noise = exponential_noise(torch.empty(vocab_size, dtype=probs.dtype, device=probs.device), generator)
    if token_ids is None:
        return int((probs / noise).argmax())
    # Only candidates can reach the (positive) maximum; among equals the lowest id wins, as in argmax.
    ratio = probs / noise[token_ids]
    return int(token_ids[ratio == ratio.max()].min())


def _zero_degenerate_rows(probs: Probs) -> torch.Tensor | None:
    """The [R] mask of rows with nothing to draw from, their probabilities set to 0; None when there are none.

    A row is degenerate when its filtered probabilities are all 0 (a top_p so small it is 0 in float32)
    or NaN (logits made infinite by an extreme penalty): a draw from it would say nothing of the model,
    so such a row takes the argmax of its logits instead. Zeroed, it draws harmlessly with the others,
    which keep their draws bit for bit.
    """
    # NaN > 0 is False and amax propagates NaN, so a row with any NaN counts as degenerate.
    degenerate = ~(probs.values.amax(dim=-1) > 0)
    if not bool(degenerate.any()):
        return None
    probs.values[degenerate] = 0.0
    return degenerate


def apply_constraints(logits: torch.Tensor, md: SamplingMetadata) -> None:
    """Penalties, min-tokens bans and grammar masks, in place: what every row's distribution is computed from."""
    if md.penalty_rows is not None:
        rows = md.penalty_rows
        apply_penalties(logits, rows, md.prompt_token_mask, md.output_token_counts, md.repetition_penalty[rows],
                        md.presence_penalty[rows], md.frequency_penalty[rows])
    if md.banned_rows:
        ban_tokens(logits, md.banned_rows, [md.stop_token_ids[row] for row in md.banned_rows])
    if md.grammar_rows is not None:
        apply_token_bitmask(logits, md.grammar_rows, md.grammar_bitmask)


def raw_logprobs(logits: torch.Tensor, md: SamplingMetadata) -> tuple[list[int], torch.Tensor] | None:
    """The rows that report logprobs, and their log_softmax ([L, vocab]) before anything changes the logits."""
    if md.max_num_logprobs is None:
        return None
    rows = (md.num_logprobs >= 0).nonzero().flatten()
    values = logits if rows.numel() == md.num_rows else logits[rows.to(logits.device)]
    return rows.tolist(), torch.log_softmax(values, dim=-1)


def logprobs_of(raw: tuple[list[int], torch.Tensor] | None, token_ids: torch.Tensor, token_id_list: list[int],
                md: SamplingMetadata) -> list[Logprobs | None]:
    """Each row's logprobs (from :func:`raw_logprobs`) for its token ``token_ids[row]``; None where not asked."""
    logprobs: list[Logprobs | None] = [None] * md.num_rows
    if raw is None:
        return logprobs
    rows, values = raw
    index = torch.tensor(rows, device=values.device)
    sampled = values.gather(1, token_ids[index][:, None]).flatten().tolist()
    top = values.topk(md.max_num_logprobs)
    top_ids, top_values, num_top = top.indices.tolist(), top.values.tolist(), md.num_logprobs.tolist()
    for i, row in enumerate(rows):
        n = num_top[row]
        logprobs[row] = Logprobs(token_id_list[row], sampled[i], top_ids[i][:n], top_values[i][:n])
    return logprobs
