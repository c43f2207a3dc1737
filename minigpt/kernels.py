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
   computed page by page (16 keys). Sums over pages (the softmax's and the values') go by a fixed
   tree of pairs over the row's own pages; when rows of different lengths share arrays (a decode
   batch), the shorter rows' extra pages are -0.0 or +0.0, which change no bit of the sum. So the
   arithmetic depends on t and the data only, not on what else is in the batch nor on how the
   sequence's pages are laid out in memory: a contiguous cache and a paged one (minigpt.paging)
   give the same bits.

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
from typing import Callable, NamedTuple, Sequence

import numpy as np

PAGE = 16  # positions per KV page and keys per attention block; cache capacities are multiples of it
ALIGN = 64  # outputs per gemv call are a multiple of this and of 4 x threads (point 2 above)
BLOCK_ELEMENTS = 100_000  # weights per block when many rows share it: ~400 KB, inside a 1 MB L2
L3_BLOCK_ELEMENTS = 4_000_000  # weights per block when few rows share it: 16 MB, inside a 32 MB L3
MANY_ROWS = 8  # from this many rows on, blocks are sized for L2 and shared between minigpt's own threads
GROUP_ROW_PAGES = 64  # query rows x pages attended together: a decode batch of short sequences is one group

# A sequence's keys and values as contiguous runs of pages, in position order: [(k, v), ...],
# each [n_head, n, head_dim] with n a multiple of PAGE (minigpt.kv_cache.KVCache.segments).
Segments = Sequence[tuple[np.ndarray, np.ndarray]]
# What an attention kernel returns: out [H, N, hd], and per sequence its weights [H, T, start + T] or None.
Attended = tuple[np.ndarray, list[np.ndarray | None]]


@dataclass(frozen=True, eq=False)
class Queries:
    """One sequence's part of an attention call: its query rows and the keys and values they see."""

    rows: slice  # its rows in q [n_head, N, head_dim]
    segments: Segments  # its keys and values, positions 0 .. start + T - 1 at least
    start: int  # the position of its first query row


@dataclass(frozen=True)
class Kernels:
    """A kernel set: the model calls only these two functions for anything order-sensitive.

    linear(x [T, n_in], weight [n_out, n_in], bias [n_out] | None) -> [T, n_out]
    attention(q [H, N, hd], parts: list[Queries], record) -> (out [H, N, hd], per part weights or None)
    """

    name: str
    linear: Callable[[np.ndarray, np.ndarray, np.ndarray | None], np.ndarray]
    attention: Callable[[np.ndarray, list[Queries], bool], Attended]


def _softmax_rows(scores: np.ndarray) -> np.ndarray:
    """Softmax along the last axis, in place (scores are overwritten); -inf scores become weights of
    exactly 0.0."""
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def _mask_future(scores: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Give every key after its query the score -inf, in place: scores [H, n, n_keys] of queries at
    `positions` [n] over keys 0 .. n_keys-1. Their weights become exactly 0.0."""
    np.copyto(scores, -np.inf, where=np.arange(scores.shape[-1]) > positions[:, None])  # mask [n, n_keys]
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
    """x [T, n_in] @ weight.T [n_in, n_out] + bias -> [T, n_out]: picoGPT's `linear`, one gemm."""
    y = x @ weight.T  # [T, n_in] @ [n_in, n_out] -> [T, n_out], one BLAS call for all rows
    return y if bias is None else y + bias


def fast_attention(q: np.ndarray, parts: list[Queries], record: bool = False) -> Attended:
    """Causal attention as everyone writes it, one sequence at a time: all of a sequence's queries
    against all its keys at once, in three passes.

    q [H, N, hd]: the query rows of every sequence in `parts`; part p's T rows are positions
    start .. start+T-1 and attend to its keys 0 .. start+T-1. Returns (out [H, N, hd], weights):
    with `record`, each part's weights [H, T, start + T], else Nones. `exact_attention` has the
    same contract.
    """
    out, weights = np.empty_like(q), []  # [H, N, hd]
    for part in parts:
        qs = q[:, part.rows]  # [H, T, hd]
        n_head, T, head_dim = qs.shape
        runs = _cut(part.segments, part.start + T)  # keys 0 .. start+T-1
        # pass 1: scores, per run [H, T, hd] @ [H, hd, n], joined -> [H, T, start+T]
        scores = np.concatenate([qs @ k.transpose(0, 2, 1) for k, _ in runs], axis=-1)
        # pass 2: scale, hide the future, softmax along each row
        scores /= np.float32(math.sqrt(head_dim))
        w = _softmax_rows(_mask_future(scores, np.arange(part.start, part.start + T)))
        # pass 3: weighted values, [H, T, n] @ [H, n, hd] per run, summed over the runs -> [H, T, hd]
        total, at = 0, 0
        for _, v in runs:
            total = total + w[..., at:at + v.shape[1]] @ v
            at += v.shape[1]
        out[:, part.rows] = total
        weights.append(w if record else None)
    return out, weights


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
    rows: L3-sized blocks of weight rows (GPT-2 small's block matrices are one block each), each block
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


class _Unit(NamedTuple):
    """Query rows of one sequence whose positions lie in one page: they attend to the same keys."""

    part: Queries
    rows: slice  # in q
    first: int  # the position of its first row
    n_pages: int  # pages attended: keys 0 .. PAGE * n_pages - 1


def _groups(parts: list[Queries]) -> list[list[_Unit]]:
    """Every sequence's query rows cut at page edges into units, and consecutive units gathered into
    groups of at most GROUP_ROW_PAGES rows x pages (a unit alone may have more)."""
    groups: list[list[_Unit]] = [[]]
    rows = pages = 0
    for part in parts:
        stop = part.start + part.rows.stop - part.rows.start
        edges = [part.start, *range((part.start // PAGE + 1) * PAGE, stop, PAGE), stop]
        to_row = part.rows.start - part.start  # position -> row of q
        for a, b in zip(edges, edges[1:]):
            unit = _Unit(part, slice(a + to_row, b + to_row), a, a // PAGE + 1)
            if groups[-1] and (rows + b - a) * max(pages, unit.n_pages) > GROUP_ROW_PAGES:
                groups.append([])
                rows = pages = 0
            groups[-1].append(unit)
            rows, pages = rows + b - a, max(pages, unit.n_pages)
    return groups


def _add_pages(pages: np.ndarray) -> np.ndarray:
    """Sum over the third axis by a fixed tree of pairs, ((p0 + p1) + (p2 + p3)) + ...: pages
    [H, G, P, ...] -> [H, G, ...]; at a level with an odd count the last node moves up alone. A row's
    pages past its last add nothing: they are -0.0 (x + -0.0 == x for every float x, -0.0 included),
    or +0.0 in sums of terms >= 0 (the softmax's). So each row's sum is the tree over its own pages
    alone, however many more the other rows of its group have."""
    while pages.shape[2] > 1:
        n = pages.shape[2]
        up = np.empty(pages.shape[:2] + ((n + 1) // 2,) + pages.shape[3:], pages.dtype)  # P -> ceil(P/2)
        np.add(pages[:, :, 0:n - 1:2], pages[:, :, 1::2], out=up[:, :, :n // 2])
        if n % 2:
            up[:, :, -1] = pages[:, :, -1]
        pages = up
    return pages[:, :, 0]


def _attend(q: np.ndarray, units: list[_Unit], out: np.ndarray) -> np.ndarray:
    """Exact attention for one group of units: their rows of out [H, N, hd] are written, and their
    weights returned, [H, G, L] (G rows; L keys, the group's widest row's)."""
    n_head, _, head_dim = q.shape
    sizes = [u.rows.stop - u.rows.start for u in units]
    at = np.cumsum([0] + sizes)  # unit i has rows at[i] .. at[i+1]-1 of the group
    rows = np.concatenate([np.arange(u.rows.start, u.rows.stop) for u in units])  # [G] rows of q
    pos = np.concatenate([np.arange(u.first, u.first + n) for u, n in zip(units, sizes)])  # [G] positions
    P = max(u.n_pages for u in units)
    G, L = len(rows), PAGE * P

    # pass 1: scores. One gemv per query over each run of its keys, [m, hd] @ [hd] -> [m]: a key's
    # score is one dot product, the same whatever run or group it is computed in.
    scores = np.empty((n_head, G, L), np.float32)  # [H, G, L]
    for u, a, b in zip(units, at, at[1:]):
        scores[:, a:b, PAGE * u.n_pages:] = -np.inf  # keys past the unit's own
        key = 0
        for k, _ in _cut(u.part.segments, PAGE * u.n_pages):
            m = k.shape[1]
            scores[:, a:b, key:key + m] = np.matmul(k[:, None], q[:, u.rows, :, None])[..., 0]  # [H, n, m]
            key += m

    # pass 2: scale, hide the future, softmax. The maximum does not depend on order; the sum is
    # taken page by page (16 keys, a fixed order), then over the pages by a fixed tree.
    scores /= np.float32(math.sqrt(head_dim))
    _mask_future(scores, pos)  # keys after each query: weight exactly 0.0
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    page_sums = scores.reshape(n_head, G, P, PAGE).sum(axis=-1)  # [H, G, P]
    weights = scores / _add_pages(page_sums)[..., None]  # [H, G, L]

    # pass 3: the weighted sum of values, one page (16 keys) at a time: [PAGE] @ [PAGE, hd] -> [hd].
    partials = np.empty((n_head, G, P, head_dim), np.float32)  # [H, G, P, hd]
    for u, a, b in zip(units, at, at[1:]):
        partials[:, a:b, u.n_pages:] = -0.0  # pages past the unit's last add nothing
        page = 0
        for _, v in _cut(u.part.segments, PAGE * u.n_pages):
            p = v.shape[1] // PAGE
            w = weights[:, a:b, page * PAGE:(page + p) * PAGE].reshape(n_head, b - a, p, 1, PAGE)
            partials[:, a:b, page:page + p] = np.matmul(w, v.reshape(n_head, 1, p, PAGE, head_dim))[..., 0, :]
            page += p

    # pass 4: each query's pages added up by the same tree of pairs.
    out[:, rows] = _add_pages(partials)  # [H, G, P, hd] -> [H, G, hd]
    return weights


def exact_attention(q: np.ndarray, parts: list[Queries], record: bool = False) -> Attended:
    """Causal attention, each row bitwise independent of every other row and of the cache's layout.

    q [H, N, hd]: the query rows of every sequence in `parts`. Returns (out [H, N, hd], weights):
    with `record`, each part's weights [H, T, start + T], else Nones. Query position t attends to
    keys 0 .. L(t)-1 with L(t) = PAGE * (t // PAGE + 1), whatever else is computed with it. Rows
    go in groups of up to GROUP_ROW_PAGES rows x pages (a decode batch of short sequences in one
    group; a long prefill, past its first pages, one page of positions per group), each group in
    four passes (`_attend`: scores, softmax, values page by page, pages added).
    """
    q = np.ascontiguousarray(q)
    out = np.empty_like(q)  # [H, N, hd]
    weights = {id(p): np.zeros((q.shape[0], p.rows.stop - p.rows.start, p.start + p.rows.stop - p.rows.start),
                               np.float32) for p in parts} if record else {}
    for units in _groups(parts):
        w = _attend(q, units, out)  # [H, G, L]
        if not record:
            continue
        g = 0  # the unit's first row in w
        for u in units:  # each unit's rows of w into its part's [H, T, start + T]
            n = u.rows.stop - u.rows.start
            full = weights[id(u.part)]  # [H, T, start + T]
            n_keys = min(w.shape[-1], full.shape[-1])
            full[:, u.first - u.part.start:u.first - u.part.start + n, :n_keys] = w[:, g:g + n, :n_keys]
            g += n
    return out, [weights.get(id(p)) for p in parts]


EXACT = Kernels("exact", exact_linear, exact_attention)
FAST = Kernels("fast", fast_linear, fast_attention)
KERNELS = {k.name: k for k in (EXACT, FAST)}
