"""Pearson's chi-square test at significance 0.001, its critical value by the Wilson-Hilferty
approximation: for the tests that sampled tokens follow a distribution exactly."""

from __future__ import annotations

import math

import numpy as np

Z_0001 = 3.0902  # the standard normal's 0.999 quantile


def chi_square_rejects(counts: np.ndarray, probs: np.ndarray) -> bool:
    """Pearson's test at significance 0.001 that `counts` were drawn from `probs` (cells with
    probability 0 must be empty)."""
    if counts[probs == 0].any():
        return True
    keep = probs > 0
    expected = probs[keep] / probs[keep].sum() * counts.sum()
    statistic = float(((counts[keep] - expected) ** 2 / expected).sum())
    df = keep.sum() - 1
    critical = df * (1 - 2 / (9 * df) + Z_0001 * math.sqrt(2 / (9 * df))) ** 3
    return statistic > critical
