"""The two places where floating-point order is decided: matrix products and attention.

Two kernel sets share one model code path (docs/exactness.md, docs/batching.md):

- `EXACT` (the default) is *batch-invariant*: every output row is computed by the same sequence of
  floating-point operations whether it is computed alone (a decode step), with the other rows of
  its sequence (a prefill, the naive loop), with other sequences' rows (a batch), or with draft
  tokens (a speculative verification), and whatever the BLAS thread count.
- `FAST` is what everyone writes: one BLAS matrix product for all rows and a softmax over all keys
  at once. Its rows drift in the last bits with the row count and the thread count.

How EXACT is built (weights are stored [n_out, n_in], so an output is a contiguous weight row):

1. Matrix-vector products only. NumPy sends a product with one row to BLAS's gemv and one with
   several rows to gemm, and gemm's rounding can depend on how many rows it gets. `exact_linear`
   never calls gemm: each row is multiplied on its own. A row's result then depends only on that
   row and the weights, never on what else is in the batch. This needs nothing from BLAS but that
   the same call on the same data gives the same answer.
2. Every gemv call produces a multiple of `alignment()` outputs: of 64 and of four times the thread
   count. The thread count enters through one door: OpenBLAS splits a large gemv's outputs between
   its threads at ceil(n / threads), and its kernel computes outputs four at a time, with
   different code for a leftover one, two or three. A split at an output that is not a multiple
   of four moves outputs between those code paths (that is why the LM head's 50,257 logits used to
   change with the thread count). With aligned calls every share is a multiple of four, so every
   output takes the four-at-a-time path: its arithmetic is the same whichever call, block or
   thread computes it. The last outputs go through a zero-padded copy of their weights. minigpt
   reads the thread count the way OpenBLAS does, from the environment at start-up (`threads`); a
   program that changes OpenBLAS's count at run time (threadpoolctl) must keep it at 1, 2, 4, 8
   or 16, where 64 outputs already divide evenly.
3. Because an output's arithmetic does not depend on the call that computes it, the weights can be
   cut into blocks for speed, differently for different row counts. Few rows (a decode step, a
   speculative verification): blocks of up to 16 MB, which stay in the L3 cache from one row to
   the next, each row one gemv per block that BLAS splits between its threads. Many rows (a
   batch, a prefill): L2-sized blocks, each multiplied by every row while it is in cache, the
   blocks shared between minigpt's own worker threads (each call small enough for BLAS to run it
   on the calling thread). That reuse is what makes batching pay (docs/batching.md). Few rows do
   not use minigpt's threads because BLAS's idle threads spin for a while after each call and
   would compete with them for the cores; many rows are worth it.
4. `exact_attention` gives query position t exactly the keys 0 .. L(t)-1, L(t) rounded up to a
   whole page: L(t) = PAGE * (t // PAGE + 1), whatever else is in the batch. Keys after t inside
   that page get score -inf and weight +0.0. Scores are one gemv per query over contiguous runs of
   pages (a key's score is one dot product, the same in any run); the weighted sum of values is
   computed page by page (16 keys), and the pages' partial sums are added in page order. So the
   arithmetic depends on t and the data only, not on how the sequence's pages are laid out in
   memory: a contiguous cache and a paged one (minigpt.paging) give the same bits.

Everything else in the model (embeddings, LayerNorm, GELU, residual adds) is elementwise or
reduces along one row. The property tests in tests/properties/ check all of this bit for bit, and
tests/test_threads.py at several BLAS thread counts.
"""

from __future__ import annotations

import contextvars
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from typing import Callable, Sequence

import numpy as np

PAGE = 16  # positions per KV page and keys per attention block; cache capacities are multiples of it
ALIGN = 64  # outputs per gemv call are a multiple of this and of 4 x threads (point 2 above)
BLOCK_ELEMENTS = 100_000  # weights per block when many rows share it: ~400 KB, inside a 1 MB L2
L3_BLOCK_ELEMENTS = 4_000_000  # weights per block when few rows share it: 16 MB, inside a 32 MB L3
MANY_ROWS = 8  # from this many rows on, blocks are sized for L2 and shared between minigpt's own threads

# A sequence's keys and values as contiguous runs of pages, in position order: [(k, v), ...],
# each [n_head, n, head_dim] with n a multiple of PAGE (minigpt.kv_cache.KVCache.segments).
Segments = Sequence[tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Kernels:
    """A kernel set: the model calls only these two functions for anything order-sensitive."""

    name: str
    # (x [T, n_in], weight [n_out, n_in], bias [n_out] | None) -> [T, n_out]
    linear: Callable[[np.ndarray, np.ndarray, np.ndarray | None], np.ndarray]
    # (q [H, T, hd] at positions start .. start+T-1, segments, start, record)
    #   -> (out [H, T, hd], weights [H, T, start + T] or None)
    attention: Callable[..., tuple[np.ndarray, np.ndarray | None]]


def _softmax_rows(scores: np.ndarray) -> np.ndarray:
    """Softmax along the last axis, in place (scores are overwritten); -inf scores become weights of
    exactly 0.0."""
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def _mask_future(scores: np.ndarray, first_query: int) -> np.ndarray:
    """Give every key after its query the score -inf, in place: scores [..., n, n_keys] of queries at
    positions first_query .. first_query+n-1 over keys 0 .. n_keys-1."""
    for r in range(scores.shape[-2]):
        scores[..., r, first_query + r + 1:] = -np.inf
    return scores


def _cut(segments: Segments, n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The first n positions of a sequence's segments, as views."""
    parts, taken = [], 0
    for k, v in segments:
        if taken >= n:
            break
        m = min(k.shape[1], n - taken)
        parts.append((k[:, :m], v[:, :m]))
        taken += m
    if taken < n:
        raise ValueError(f"the cache segments hold {taken} positions, attention needs {n}")
    return parts


# ----------------------------------------------------------------------------- fast: plain BLAS


def fast_linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    y = x @ weight.T  # [T, n_in] @ [n_in, n_out] -> [T, n_out], one BLAS call for all rows
    return y if bias is None else y + bias


def fast_attention(q, segments: Segments, start: int, record: bool = False):
    n_head, T, head_dim = q.shape
    L = start + T  # keys 0 .. L-1 exist
    parts = _cut(segments, L)
    # per run [H, T, hd] @ [H, hd, n], joined -> [H, T, L]
    scores = np.concatenate([q @ k.transpose(0, 2, 1) for k, _ in parts], axis=-1)
    weights = _softmax_rows(_mask_future(scores / np.float32(math.sqrt(head_dim)), start))
    out, at = 0, 0
    for _, v in parts:  # [H, T, n] @ [H, n, hd], summed over the runs -> [H, T, hd]
        out = out + weights[..., at:at + v.shape[1]] @ v
        at += v.shape[1]
    return out, (weights if record else None)


# ------------------------------------------------------------------- exact: batch-invariant


@cache
def threads() -> int:
    """The number of threads OpenBLAS runs, decided as OpenBLAS decides it (once, at start-up): the
    first of OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS, OMP_NUM_THREADS that is set, at most the CPUs
    this process may run on. minigpt's own worker threads are as many."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for name in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) >= 1:
            return min(int(value), cpus, 64)
    return min(cpus, 64)


@cache
def alignment() -> int:
    """Every gemv call computes a multiple of this many outputs: of ALIGN, and of 4 x the thread
    count, so that OpenBLAS's split at ceil(n / threads) gives every thread a multiple of four."""
    return math.lcm(ALIGN, 4 * threads())


@cache
def _workers() -> ThreadPoolExecutor | None:
    """The worker threads that share weight blocks with the calling thread (None: it works alone).
    NumPy releases the GIL inside a matrix product, so they run in parallel."""
    n = threads()
    return ThreadPoolExecutor(n - 1, thread_name_prefix="minigpt-kernels") if n > 1 else None


def _gemv_blocks(weight: np.ndarray, x: np.ndarray, y: np.ndarray) -> None:
    """y = x @ weight.T for weight [m, n_in] (m a multiple of alignment()), x [T, n_in], into y [T, m]: one
    gemv per weight block and row, block-major so that a block is read from memory once and from
    cache for the other rows."""
    m, n_in = weight.shape
    if m == 0:
        return
    T, a = x.shape[0], alignment()
    cols = min(m, a * max(1, BLOCK_ELEMENTS // (a * n_in)))
    full = m // cols * cols
    for first, blocks in ((0, weight[:full].reshape(full // cols, cols, n_in)), (full, weight[full:][None])):
        nb, c, _ = blocks.shape
        if c:
            # `out` block-major and contiguous: NumPy loops in the order of the output's memory
            out = np.matmul(blocks[:, None], x[None, :, :, None])  # nb x T x ([c, n_in] @ [n_in, 1])
            y[:, first:first + nb * c] = out[..., 0].transpose(1, 0, 2).reshape(T, nb * c)


def _blocked(weight: np.ndarray, x: np.ndarray) -> np.ndarray:
    """weight [n, n_in] (n a multiple of alignment()) times each row of x [T, n_in] -> [T, n]: the
    weight's rows split between the threads at multiples of alignment(), each share in blocks."""
    n, a = weight.shape[0], alignment()
    y = np.empty((x.shape[0], n), np.float32)
    n_threads = threads() if _workers() is not None else 1
    edges = [a * round(i * n / (a * n_threads)) for i in range(n_threads + 1)]
    futures = [_workers().submit(contextvars.copy_context().run, _gemv_blocks, weight[lo:hi], x, y[:, lo:hi])
               for lo, hi in zip(edges[1:-1], edges[2:]) if hi > lo]  # in the caller's context: its np.errstate
    _gemv_blocks(weight[:edges[1]], x, y[:, :edges[1]])  # the calling thread's share
    for f in futures:
        f.result()
    return y


def _per_row(weight: np.ndarray, x: np.ndarray) -> np.ndarray:
    """weight [n, n_in] (n a multiple of alignment()) times each row of x [T, n_in] -> [T, n] for few
    rows: L3-sized blocks of weight rows (a GPT-2 layer's matrices are one block each), each block
    times each row by one gemv that BLAS splits between its threads; the rows after the first read
    the block from cache."""
    n, n_in = weight.shape
    a = alignment()
    cols = max(a, L3_BLOCK_ELEMENTS // (a * n_in) * a)
    y = np.empty((x.shape[0], n), np.float32)
    for lo in range(0, n, cols):
        y[:, lo:lo + cols] = np.matmul(weight[lo:lo + cols][None], x[:, :, None])[..., 0]  # T x ([c, n_in] @ [n_in])
    return y


def exact_linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """x [T, n_in] times weight [n_out, n_in] (+ bias) -> [T, n_out], by matrix-vector products only."""
    T, n_in = x.shape
    n_out, a = weight.shape[0], alignment()
    x = np.ascontiguousarray(x)
    head = n_out - n_out % a  # outputs in calls of a multiple of `a`
    y = np.empty((T, n_out), np.float32)
    if head:
        y[:, :head] = (_blocked if T >= MANY_ROWS else _per_row)(weight[:head], x)  # [T, head]
    if head < n_out:  # the last n_out % a outputs, from a zero-padded a-row copy of their weights
        tail = np.zeros((a, n_in), np.float32)
        tail[:n_out - head] = weight[head:]
        y[:, head:] = np.matmul(tail[None], x[:, :, None])[:, :n_out - head, 0]  # T x ([a, n_in] @ [n_in, 1])
    return y if bias is None else y + bias


def exact_attention(q, segments: Segments, start: int, record: bool = False):
    n_head, T, head_dim = q.shape
    q = np.ascontiguousarray(q)
    out = np.empty_like(q)  # [H, T, hd]
    weights_all = np.zeros((n_head, T, start + T), np.float32) if record else None
    scale = np.float32(math.sqrt(head_dim))
    first, last = start // PAGE, (start + T - 1) // PAGE
    for block in range(first, last + 1):  # the queries sharing one padded key length
        lo, hi = max(start, block * PAGE), min(start + T, (block + 1) * PAGE)
        rows, n = slice(lo - start, hi - start), hi - lo
        L = (block + 1) * PAGE  # L(t) for every query t in this block
        parts = _cut(segments, L)
        qs = q[:, rows, :, None]  # [H, n, hd, 1]
        scores = [np.matmul(k[:, None], qs)[..., 0] for k, _ in parts]  # per query and run: [m, hd] @ [hd]
        scores = scores[0] if len(scores) == 1 else np.concatenate(scores, axis=-1)  # [H, n, L]
        scores /= scale
        weights = _softmax_rows(_mask_future(scores, lo))  # [H, n, L]; keys after each query weigh exactly 0.0
        paged_w = weights.reshape(n_head, n, L // PAGE, 1, PAGE)
        partials, at = [], 0  # per query and page: [PAGE] @ [PAGE, hd] -> [hd]
        for _, v in parts:
            p = v.shape[1] // PAGE
            pages_v = v.reshape(n_head, 1, p, PAGE, head_dim)  # [H, 1, p, PAGE, hd]
            partials.append(np.matmul(paged_w[:, :, at:at + p], pages_v)[:, :, :, 0])  # [H, n, p, hd]
            at += p
        by_page = partials[0] if len(partials) == 1 else np.concatenate(partials, axis=2)  # [H, n, L/PAGE, hd]
        out[:, rows] = by_page.transpose(0, 1, 3, 2).copy().sum(axis=-1)  # pages added along one contiguous row
        if record:
            n_keys = min(L, start + T)
            weights_all[:, rows, :n_keys] = weights[..., :n_keys]  # keys past L are never computed: 0
    return out, weights_all


EXACT = Kernels("exact", exact_linear, exact_attention)
FAST = Kernels("fast", fast_linear, fast_attention)
KERNELS = {k.name: k for k in (EXACT, FAST)}
