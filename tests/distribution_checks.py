"""Goodness-of-fit checks for samplers: Pearson's chi-square against known probabilities."""
from __future__ import annotations

import torch

# A correct sampler fails a check at this p-value once in a thousand seeds; every check here runs on a fixed
# seed, so a pass is reproducible, and a wrong sampler's p-values are far below it (see the bias tests).
MIN_P_VALUE = 1e-3


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """P-value of Pearson's chi-square for ``counts`` [n] (int) drawn from ``probs`` [n] (summing to 1).

    Cells expected fewer than ``min_expected`` times are pooled into one, as the test's chi-square
    approximation needs; a category the probabilities rule out but that was observed gives 0.
    """
    counts, probs = counts.double(), probs.double()
    total = counts.sum()
    if bool((counts[probs == 0] > 0).any()):
        return 0.0
    expected = probs * total
    small = expected < min_expected
    observed = torch.cat([counts[~small], counts[small].sum()[None]])
    expected = torch.cat([expected[~small], expected[small].sum()[None]])
    keep = expected > 0
    observed, expected = observed[keep], expected[keep]
    statistic = ((observed - expected) ** 2 / expected).sum()
    dof = observed.numel() - 1
    if dof < 1:
        return 1.0
    # Survival function of chi-square with dof degrees: the regularized upper incomplete gamma Q(dof/2, x/2).
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), statistic / 2))


def uniformity_p_value(values: torch.Tensor, num_bins: int = 20) -> float:
    """P-value of the chi-square test that ``values`` (in [0, 1)) are uniform, over ``num_bins`` equal bins."""
    bins = (values.double() * num_bins).long().clamp(0, num_bins - 1)
    counts = torch.bincount(bins, minlength=num_bins)
    return chi_square_p_value(counts, torch.full((num_bins,), 1 / num_bins, dtype=torch.float64))


def randomized_pit(probs: torch.Tensor, token_ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The randomized probability integral transform of each token under its row's distribution: uniform on [0, 1)
    exactly when the tokens were drawn from those distributions.

    ``probs`` [N, vocab] (rows summing to 1), ``token_ids`` [N]. Tokens are ordered by descending probability,
    so a sampler that favours likely tokens (or unlikely ones) pushes the values towards 0 (or 1).
    """
    order = probs.argsort(dim=-1, descending=True, stable=True)
    sorted_probs = probs.gather(1, order)
    rank = (order == token_ids[:, None]).int().argmax(dim=-1)
    below = (sorted_probs.cumsum(-1) - sorted_probs).gather(1, rank[:, None]).flatten()
    mass = sorted_probs.gather(1, rank[:, None]).flatten()
    return below + torch.rand(len(token_ids), generator=generator, dtype=probs.dtype) * mass


def nucleus_probs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """softmax(logits / temperature) over each row's top-p nucleus, renormalised ([N, vocab], in logits' dtype)."""
    probs = torch.softmax(logits / temperature, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    drop = (sorted_probs.cumsum(-1) - sorted_probs >= top_p) & (top_p < 1)
    probs = probs.scatter(1, order, sorted_probs.masked_fill(drop, 0.0))
    return probs / probs.sum(-1, keepdim=True)
