"""Batched logit and probability filters: penalties, min-tokens bans, temperature, top-k, top-p and min-p.

Each works on a [R, vocab] float32 batch with one setting per row and gives, row for row, bit for bit
the float32 result of applying the same step to that row alone (on the CPU, where cumsum runs in order):
a row's neutral setting leaves it untouched, so rows that share a batch do not affect each other.
"""
from __future__ import annotations

import torch

# Top-p and the noise draw work on a row's nonzero probabilities only when there are at most this
# fraction of the vocabulary of them (top-k makes them few); otherwise the full vocabulary is cheaper.
_CANDIDATE_FRACTION = 16


def apply_penalties(logits: torch.Tensor, prompt_mask: torch.Tensor, output_counts: torch.Tensor,
                    repetition: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor) -> None:
    """Repetition (HF: prompt and output tokens) then presence and frequency (OpenAI: output only), in place.

    ``logits``, ``prompt_mask`` (bool) and ``output_counts`` (int) are [P, vocab]; the penalties are [P].
    """
    repetition, presence, frequency = (t.to(logits.device) for t in (repetition, presence, frequency))
    seen = prompt_mask | (output_counts > 0)
    repetition = repetition[:, None]
    penalized = torch.where(logits > 0, logits / repetition, logits * repetition)
    torch.where(seen, penalized, logits, out=logits)
    logits -= frequency[:, None] * output_counts.to(logits.dtype) + presence[:, None] * (output_counts > 0)


def ban_tokens(logits: torch.Tensor, rows: list[int], token_ids: list[tuple[int, ...]]) -> None:
    """Set ``token_ids[i]`` (non-empty, ids < vocab) of row ``rows[i]`` to -inf, in place."""
    width = max(len(ids) for ids in token_ids)
    # Pad each row by repeating its first id: writing -inf twice is harmless. [K, width]
    padded = torch.tensor([list(ids) + [ids[0]] * (width - len(ids)) for ids in token_ids], device=logits.device)
    logits[torch.tensor(rows, device=logits.device)[:, None], padded] = float("-inf")


def top_k_filter(logits: torch.Tensor, top_k: torch.Tensor) -> None:
    """Keep each row's k highest logits and ties with the k-th (top_k [R] int64, 0 = off), in place.

    ``top_k`` is best kept on the CPU: its maximum decides how many values to find.
    """
    vocab = logits.shape[-1]
    top_k = top_k.clamp(max=vocab)
    values = logits.topk(int(top_k.max())).values  # [R, max_k], descending
    top_k = top_k.to(logits.device)
    kth = values.gather(1, (top_k - 1).clamp(min=0)[:, None])
    kth = kth.masked_fill(top_k[:, None] == 0, float("-inf"))  # an off row keeps everything
    logits.masked_fill_(logits < kth, float("-inf"))


def top_p_filter(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Keep each row's smallest set of most likely tokens whose mass reaches top_p ([R], 1 = off).

    A token is dropped when the mass of the tokens sorted before it already reaches top_p. The kept set
    is the one a full descending ``sort`` of the row keeps, even where equal probabilities straddle the cut.
    """
    top_p = top_p.to(probs.device)
    candidates = nonzero_candidates(probs)
    if candidates is None:
        return _top_p_sorted(probs, top_p)
    values, order = candidates
    drop = _nucleus_drop(values, top_p)
    kept = torch.zeros_like(probs).scatter_(1, order, values.masked_fill(drop, 0.0))
    # topk orders equal probabilities its own way; where the drop decision differs inside a run of equal
    # ones, which of them stay depends on that order, so those rows take the full sort.
    split_tie = ((values[:, 1:] == values[:, :-1]) & (drop[:, 1:] != drop[:, :-1]) & (values[:, 1:] > 0)).any(-1)
    if bool(split_tie.any()):
        rows = split_tie.nonzero().flatten()
        kept[rows] = _top_p_sorted(probs[rows], top_p[rows])
    return kept


def min_p_filter(probs: torch.Tensor, min_p: torch.Tensor) -> None:
    """Drop tokens less likely than min_p ([R], 0 = off) times the row's most likely token, in place."""
    min_p = min_p.to(probs.device)
    probs.masked_fill_(probs < min_p[:, None] * probs.max(-1, keepdim=True).values, 0.0)


def nonzero_candidates(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Every row's nonzero probabilities as (values, token ids), [R, n] descending, or None when n is large.

    n is the largest nonzero count of any row, so shorter rows are padded with zero-probability tokens.
    """
    n = int((probs > 0).sum(-1).max())
    if n > probs.shape[-1] // _CANDIDATE_FRACTION:
        return None
    return probs.topk(n)


def _top_p_sorted(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    values, order = probs.sort(descending=True)
    return probs.scatter(1, order, values.masked_fill(_nucleus_drop(values, top_p), 0.0))


def _nucleus_drop(sorted_probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    # A row with top_p 1 keeps everything, even where rounding makes the mass before a token reach 1.
    return (sorted_probs.cumsum(-1) - sorted_probs >= top_p[:, None]) & (top_p[:, None] < 1)


def filtered_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor | None = None,
                   top_p: torch.Tensor | None = None, min_p: torch.Tensor | None = None) -> torch.Tensor:
    """Probabilities after temperature ([R], > 0), top-k, top-p and min-p; None skips a filter for every row.

    ``logits`` [R, vocab] is divided by the temperature in place.
    """
    logits.div_(temperature.to(logits.device)[:, None])
    if top_k is not None:
        top_k_filter(logits, top_k)
    probs = torch.softmax(logits, dim=-1)
    if top_p is not None:
        probs = top_p_filter(probs, top_p)
    if min_p is not None:
        min_p_filter(probs, min_p)
    return probs
