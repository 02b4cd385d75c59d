"""Prompt logprobs: how likely each prompt token was given the tokens before it, from the raw model logits."""
from __future__ import annotations

import torch

from jido.core.outputs import PromptLogprobsLists


def compute_prompt_logprobs(logits: torch.Tensor, next_token_ids: torch.Tensor,
                            num_top: int) -> PromptLogprobsLists:
    """Score ``next_token_ids`` ([R]) under ``logits`` ([R, vocab] float32, row i predicting token i).

    Returns each token's log-probability, its rank (as vLLM counts it: how many tokens are at least as
    likely, itself included, so the most likely token has rank 1) and the ``num_top`` most likely tokens
    with theirs. The distribution is the model's own: no temperature, penalty or filter touches it.
    """
    logprobs = torch.log_softmax(logits, dim=-1)
    chosen = logprobs.gather(1, next_token_ids[:, None])  # [R, 1]
    ranks = (logprobs >= chosen).sum(dim=-1)
    top = logprobs.topk(num_top, dim=-1)
    return PromptLogprobsLists(chosen.flatten().tolist(), ranks.tolist(), top.indices.tolist(),
                               top.values.tolist())
