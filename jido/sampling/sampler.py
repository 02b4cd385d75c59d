"""Sampler: turns the logits of a batch of rows into next tokens, each row with its own settings."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from jido.core.outputs import Logprobs
from jido.core.sampling_params import SamplingParams

_SEED_MIX = 0x9E3779B97F4A7C15  # spreads (seed, position) pairs over the generator's seed space


@dataclass
class SamplingRow:
    """What one row of the logits needs to be sampled: its settings and its token history."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    eos_token_ids: tuple[int, ...]


class Sampler:
    """Greedy, temperature, top-k, top-p, min-p and penalties, with per-request seeds.

    A seeded row draws its randomness from a generator seeded by (seed, output position), so the same
    seed gives the same tokens whatever else is in the batch and even after preemption and recompute.
    """

    def __init__(self, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(self.device)
        self.generator.manual_seed(seed)

    def sample(self, logits: torch.Tensor, rows: list[SamplingRow]) -> tuple[list[int], list[Logprobs | None]]:
        """Sample one token per row of ``logits`` ([num_rows, vocab], float32)."""
        raw_logprobs = None
        if any(row.params.logprobs is not None for row in rows):
            raw_logprobs = torch.log_softmax(logits, dim=-1)
        logits = self._apply_constraints(logits, rows)
        token_ids = self._choose(logits, rows)
        logprobs = [_row_logprobs(raw_logprobs, i, token_ids[i], row.params.logprobs)
                    if raw_logprobs is not None else None for i, row in enumerate(rows)]
        return token_ids, logprobs

    def _apply_constraints(self, logits: torch.Tensor, rows: list[SamplingRow]) -> torch.Tensor:
        needs = [i for i, r in enumerate(rows) if r.params.needs_penalties or _blocks_stop_tokens(r)]
        if not needs:
            return logits
        logits = logits.clone()
        for i in needs:
            row = rows[i]
            if row.params.needs_penalties:
                apply_penalties(logits[i], row.params, row.prompt_token_ids, row.output_token_ids)
            if _blocks_stop_tokens(row):
                banned = list(row.params.stop_token_ids) + ([] if row.params.ignore_eos else list(row.eos_token_ids))
                logits[i, [t for t in banned if t < logits.shape[-1]]] = float("-inf")
        return logits

    def _choose(self, logits: torch.Tensor, rows: list[SamplingRow]) -> list[int]:
        token_ids = logits.argmax(dim=-1).tolist()
        for i, row in enumerate(rows):
            if not row.params.is_greedy:
                token_ids[i] = self._sample_row(logits[i], row)
        return token_ids

    def _sample_row(self, logits: torch.Tensor, row: SamplingRow) -> int:
        probs = filtered_probs(logits, row.params)
        generator = self.generator
        if row.params.seed is not None:
            generator = torch.Generator(logits.device)
            position = len(row.output_token_ids)
            generator.manual_seed((row.params.seed * _SEED_MIX + position) % (2**63))
        # Gumbel-max in its exponential form: argmax(p / E) with E ~ Exp(1) draws from p, without a
        # cumulative sum and with one random draw per vocabulary entry.
        noise = torch.empty_like(probs).exponential_(generator=generator)
        return int((probs / noise).argmax())


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k, top-p and min-p, for one row."""
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        # Keep the smallest set whose mass reaches top_p: drop a token when the mass before it already does.
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        probs = probs.scatter(0, order, sorted_probs.masked_fill(drop, 0.0))
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    return probs


def apply_penalties(logits: torch.Tensor, params: SamplingParams, prompt_token_ids: list[int],
                    output_token_ids: list[int]) -> None:
    """Repetition (HF: prompt and output), presence and frequency (OpenAI: output only), in place."""
    vocab = logits.shape[-1]
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted({t for t in prompt_token_ids + output_token_ids if t < vocab}),
                            dtype=torch.long, device=logits.device)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / params.repetition_penalty,
                                   values * params.repetition_penalty)
    if output_token_ids and (params.presence_penalty or params.frequency_penalty):
        counts = torch.bincount(torch.tensor(output_token_ids, device=logits.device), minlength=vocab)[:vocab]
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)


def _blocks_stop_tokens(row: SamplingRow) -> bool:
    return len(row.output_token_ids) < row.params.min_tokens


def _row_logprobs(raw: torch.Tensor, i: int, token_id: int, num_top: int | None) -> Logprobs | None:
    if num_top is None:
        return None
    top = torch.topk(raw[i], num_top) if num_top > 0 else None
    return Logprobs(token_id, float(raw[i, token_id]),
                    top.indices.tolist() if top is not None else [],
                    top.values.tolist() if top is not None else [])
