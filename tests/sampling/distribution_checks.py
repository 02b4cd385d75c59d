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
