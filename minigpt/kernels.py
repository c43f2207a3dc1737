"""The two places where floating-point order is decided: matrix products and attention.

Two kernel sets share one model code path (see docs/exactness.md):

- `EXACT` (the default) is *row-invariant*: every output row is computed by the same sequence of
  floating-point operations on operands of the same shape, whether its row is computed alone (a
  cached decode step), with its neighbours (the naive loop's full pass) or in a prefill chunk of
  any size. That is what makes cached K/V bitwise exact.
- `FAST` is what everyone writes: one BLAS matrix product for all rows and a masked softmax over
  the full square. BLAS picks different blockings for different row counts and `np.sum`
  re-associates with length, so rows drift in the last bits as the sequence grows.

How EXACT achieves row invariance:

1. `linear` multiplies each row by its own BLAS call of shape [1, n_in] @ [n_in, n_out]
   (`np.matmul` over a stack of single rows runs one matrix-vector product per row). A row's
   result then depends only on that row and the weight, never on how many rows came with it.
2. `attention` gives query position t exactly the keys 0 .. L(t)-1 with L(t) rounded up to a
   whole block, L(t) = KEY_BLOCK * (t // KEY_BLOCK + 1), whatever else is in the batch. Scores,
   max, exp, sum and the weighted sum of values are per-query operations over that fixed length
   (matrix-vector products and reductions along the last axis), so their results depend on t and
   the data only. Keys t+1 .. L(t)-1 are in the future: their scores are set to -inf, so their
   weights are exactly 0.0 and add exact zeros. Rounding L(t) up to a block lets a whole block of
   queries share one stacked call, which keeps prefill fast; the KV cache's capacity is always a
   multiple of KEY_BLOCK so that those padded keys exist (zeros) in every cache.

Everything else in the model (embeddings, LayerNorm, GELU, residual adds) is elementwise or
reduces along one row, so it is row-invariant as it stands. The property tests in
tests/properties/ check all of this bit for bit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

KEY_BLOCK = 16  # queries per stacked attention call; cache capacities are multiples of it


@dataclass(frozen=True)
class Kernels:
    """A kernel set: the model calls only these two functions for anything order-sensitive."""

    name: str
    # (x [T, n_in], weight [n_in, n_out], bias [n_out] | None) -> [T, n_out]
    linear: Callable[[np.ndarray, np.ndarray, np.ndarray | None], np.ndarray]
    # (q [H, T, hd], k_buf [H, capacity, hd], v_buf [H, capacity, hd], start, record)
    #   -> (out [H, T, hd], weights [H, T, start + T] or None)
    attention: Callable[..., tuple[np.ndarray, np.ndarray | None]]


def _softmax_rows(scores: np.ndarray) -> np.ndarray:
    """Softmax along the last axis; -inf scores become weights of exactly 0.0."""
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    return weights / weights.sum(axis=-1, keepdims=True)


def _causal_scores(scores: np.ndarray, query_pos: np.ndarray, n_keys: int) -> np.ndarray:
    """Set the score of every key after its query to -inf (query_pos: absolute positions [T])."""
    future = np.arange(n_keys) > query_pos[:, None]  # [T, n_keys]
    return np.where(future, np.float32(-np.inf), scores)


# ----------------------------------------------------------------------------- fast: plain BLAS


def fast_linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    y = x @ weight  # [T, n_in] @ [n_in, n_out] -> [T, n_out], one BLAS call for all rows
    return y if bias is None else y + bias


def fast_attention(q, k_buf, v_buf, start: int, record: bool = False):
    n_head, T, head_dim = q.shape
    L = start + T  # keys 0 .. L-1 exist
    k, v = k_buf[:, :L], v_buf[:, :L]  # [H, L, hd]
    scores = q @ k.transpose(0, 2, 1) / np.float32(math.sqrt(head_dim))  # [H, T, hd] @ [H, hd, L] -> [H, T, L]
    weights = _softmax_rows(_causal_scores(scores, np.arange(start, L), L))  # [H, T, L]
    out = weights @ v  # [H, T, L] @ [H, L, hd] -> [H, T, hd]
    return out, (weights if record else None)


# ------------------------------------------------------------------- exact: row-invariant


def exact_linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    y = np.matmul(x[:, None, :], weight)[:, 0, :]  # T x ([1, n_in] @ [n_in, n_out]) -> [T, n_out]
    return y if bias is None else y + bias


def exact_attention(q, k_buf, v_buf, start: int, record: bool = False):
    n_head, T, head_dim = q.shape
    q = np.ascontiguousarray(q)
    out = np.empty_like(q)  # [H, T, hd]
    weights_all = np.zeros((n_head, T, start + T), np.float32) if record else None
    scale = np.float32(math.sqrt(head_dim))
    first, last = start // KEY_BLOCK, (start + T - 1) // KEY_BLOCK
    for block in range(first, last + 1):  # the queries sharing one padded key length
        lo, hi = max(start, block * KEY_BLOCK), min(start + T, (block + 1) * KEY_BLOCK)
        rows = slice(lo - start, hi - start)
        L = (block + 1) * KEY_BLOCK  # L(t) for every query t in this block
        k, v = k_buf[:, None, :L], v_buf[:, None, :L]  # [H, 1, L, hd], shared by the block's queries
        scores = np.matmul(k, q[:, rows, :, None])[..., 0] / scale  # per query: [L, hd] @ [hd] -> [H, n, L]
        weights = _softmax_rows(_causal_scores(scores, np.arange(lo, hi), L))  # [H, n, L]
        out[:, rows] = np.matmul(weights[:, :, None, :], v)[:, :, 0]  # per query: [L] @ [L, hd] -> [H, n, hd]
        if record:
            n_keys = min(L, start + T)
            weights_all[:, rows, :n_keys] = weights[..., :n_keys]  # keys past L are never computed: 0
    return out, weights_all


EXACT = Kernels("exact", exact_linear, exact_attention)
FAST = Kernels("fast", fast_linear, fast_attention)
KERNELS = {k.name: k for k in (EXACT, FAST)}
