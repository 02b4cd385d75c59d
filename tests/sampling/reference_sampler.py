"""The one-row-at-a-time sampler the batched one replaced, kept as the reference its results must equal."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from jido.core.sampling_params import SamplingParams

SEED_MIX = 0x9E3779B97F4A7C15


@dataclass
class Row:
    """One row of a batch as the reference sees it: settings and token history."""

    params: SamplingParams
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    eos_token_ids: tuple[int, ...] = (1,)


def reference_sample(logits: torch.Tensor, rows: list[Row], generator: torch.Generator) -> list[int]:
    """Tokens for ``logits`` [B, vocab] float32, row by row; unseeded rows draw from ``generator``."""
    logits = logits.clone()
    token_ids = []
    for i, row in enumerate(rows):
        constrained_logits(logits[i], row)
        if row.params.is_greedy:
            token_ids.append(int(logits[i].argmax()))
            continue
        probs = reference_filtered_probs(logits[i], row.params)
        g = generator
        if row.params.seed is not None:
            g = torch.Generator(logits.device)
            g.manual_seed((row.params.seed * SEED_MIX + len(row.output_token_ids)) % (2**63))
        noise = -torch.log(torch.empty_like(probs).uniform_(generator=g))  # Exp(1) by inversion
        token_ids.append(int((probs / noise).argmax()))
    return token_ids


def constrained_logits(logits: torch.Tensor, row: Row) -> None:
    """Penalties, then min-tokens bans, on one row ([vocab]) in place."""
    if row.params.needs_penalties:
        reference_penalties(logits, row.params, row.prompt_token_ids, row.output_token_ids)
    if len(row.output_token_ids) < row.params.min_tokens:
        banned = list(row.params.stop_token_ids) + ([] if row.params.ignore_eos else list(row.eos_token_ids))
        logits[[t for t in banned if t < logits.shape[-1]]] = float("-inf")


def reference_filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k, top-p and min-p, for one row."""
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        drop = sorted_probs.cumsum(-1) - sorted_probs >= params.top_p
        probs = probs.scatter(0, order, sorted_probs.masked_fill(drop, 0.0))
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    return probs


def reference_penalties(logits: torch.Tensor, params: SamplingParams, prompt_token_ids: list[int],
                        output_token_ids: list[int]) -> None:
    vocab = logits.shape[-1]
    if params.repetition_penalty != 1.0:
        seen = torch.tensor(sorted({t for t in prompt_token_ids + output_token_ids if t < vocab}), dtype=torch.long)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / params.repetition_penalty, values * params.repetition_penalty)
    if output_token_ids and (params.presence_penalty or params.frequency_penalty):
        counts = torch.bincount(torch.tensor(output_token_ids), minlength=vocab)[:vocab]
        logits -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0)
