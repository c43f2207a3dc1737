"""The fast kernels: layers.PLAIN's arithmetic, quicker where plain NumPy is slow on few rows or
long prompts. Not batch-invariant: a row's bits may depend on the rows computed with it.

- `fast_linear`: one gemm for many rows, as layers.linear; for few rows, where OpenBLAS's gemm is
  slower than a gemv per row, the exact linear map.
- `fast_attend`: a long prefill's queries a block at a time, each block over the keys it can see.
- `fast_attend_batch`: a batch's sequences one after another, each over its own keys.
"""

from __future__ import annotations

import numpy as np

from ..gpt2.layers import attend, linear
from .attention import BatchPart
from .linear import exact_linear
from .tuning import in_force


def fast_linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """layers.linear (one gemm for all rows) from in_force().gemm_rows rows on; for fewer rows, where
    OpenBLAS's gemm is slower than a gemv per row, exact_linear."""
    return linear(x, weight, bias) if x.shape[0] >= in_force().gemm_rows else exact_linear(x, weight, bias)


QUERY_BLOCK = 128  # the fast kernels' attention takes a long prefill's queries this many at a time


def fast_attend(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """layers.attend for q [H, T, hd] over k, v [H, S, hd], QUERY_BLOCK queries at a time, each block
    over the keys up to its last position only: a prefill skips most of the future it would mask."""
    T, S = q.shape[1], k.shape[1]
    if T <= QUERY_BLOCK:
        return attend(q, k, v)
    out = np.empty_like(q)  # [H, T, hd]
    for lo in range(0, T, QUERY_BLOCK):
        end = S - T + min(T, lo + QUERY_BLOCK)  # the block's last position + 1
        out[:, lo:lo + QUERY_BLOCK] = attend(q[:, lo:lo + QUERY_BLOCK], k[:, :end], v[:, :end])
    return out


def fast_attend_batch(q: np.ndarray, parts: list[BatchPart]) -> np.ndarray:
    """fast_attend for several sequences' rows of q [H, N, hd], each over its own keys and values
    (its segments joined): [H, N, hd]."""
    out = np.empty_like(q)
    for p in parts:
        k, v = ((np.concatenate(a, axis=1) if len(a) > 1 else a[0])[:, :p.length] for a in zip(*p.segments))
        out[:, p.rows] = fast_attend(q[:, p.rows], k, v)
    return out
