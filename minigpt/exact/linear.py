"""The exact linear map: x @ weight by matrix-vector products, every row's bits the same whatever
other rows are computed with it and however many threads compute them.

1. `exact_linear` multiplies each row by the weights on its own, by matrix-vector products
   (gemv), never by one matrix-matrix product (gemm), whose rounding depends on the row count.
   The weights are read where they lie: a checkpoint's [n_in, n_out] (OpenBLAS's gemv "N", each
   output a column) or the tied head's wte.T, a view of [vocab, C] (gemv "T", each output a row).
2. Every gemv call computes a multiple of `alignment()` outputs, so that OpenBLAS's split of a
   call between its threads gives each thread a multiple of sixteen: every output then takes the
   same code path, whatever the thread count.
3. How the weights are cut into blocks, and which thread computes a block, changes no bit; so
   the blocks can be sized for the machine's caches, or by measuring it (minigpt.exact.tuning).

docs/exactness.md tells the whole argument, with its measurements.
"""

from __future__ import annotations

from functools import partial

import numpy as np

from .threads import alignment, threads, together, workers
from .tuning import in_force


# OpenBLAS's SkylakeX gemv "N" takes another kernel for calls of more than this many outputs on at
# most 48 inputs (docs/exactness.md): no call is larger, whatever the cut.
MAX_CALL = 16384

# From this many rows on, a block of a checkpoint's [n_in, n_out] weights is copied into a contiguous
# scratch before its gemv calls: gemv "N" reads the block's short strided rows at about a third of
# its speed on contiguous ones, and the copy changes no product (lda is only an address).
COPY_ROWS = 3


def _columns(weight: np.ndarray) -> bool:
    """Whether weight [n_in, n_out] is the transpose of a C-contiguous array (wte.T): each output's
    weights contiguous, gemv "T"; else each input's are, gemv "N"."""
    return weight.flags.f_contiguous and not weight.flags.c_contiguous


def _gemv_blocks(weight: np.ndarray, x: np.ndarray, y: np.ndarray, elements: int) -> None:
    """y = x @ weight for weight [n_in, m] (m a multiple of alignment()), x [T, n_in], into y [T, m]:
    the weight's outputs cut into nearly equal blocks of about `elements` weights (a multiple of
    alignment() outputs each), one gemv per block and row, block-major, so that a block is read
    from memory once and from cache for the other rows."""
    n_in, m = weight.shape
    if m == 0:
        return
    T, a = x.shape[0], alignment()
    n_blocks = max(1, round(m * n_in / max(elements, 1)))
    cols = a * min(-(-m // (a * n_blocks)), MAX_CALL // a)  # outputs per block
    full = m // cols * cols
    blocks = weight[:, :full].reshape(n_in, full // cols, cols).transpose(1, 0, 2)  # a view [nb, n_in, cols]
    for first, part in ((0, blocks), (full, weight[:, full:][None])):
        nb, _, c = part.shape
        if not c:
            continue
        # `out` block-major and contiguous: NumPy loops in the order of the output's memory. One
        # row of y (its outputs contiguous) is that order already, so the products go straight in.
        if T == 1:
            np.matmul(x[None, :, None], part[:, None], out=y[0, first:first + nb * c].reshape(nb, 1, 1, c))
            continue
        out = np.empty((nb, T, 1, c), np.float32)  # nb x T x ([1, n_in] @ [n_in, c])
        if T < COPY_ROWS or _columns(weight):
            np.matmul(x[None, :, None], part[:, None], out=out)
        else:  # each block copied whole first: same products, read contiguously
            scratch = np.empty((n_in, c), np.float32)
            for block, into in zip(part, out):
                np.copyto(scratch, block)
                np.matmul(x[:, None], scratch, out=into)
        y[:, first:first + nb * c] = out[:, :, 0].transpose(1, 0, 2).reshape(T, nb * c)


def _shared(weight: np.ndarray, x: np.ndarray, y: np.ndarray, elements: int) -> None:
    """_gemv_blocks with weight's outputs split between minigpt's threads at multiples of alignment(),
    each share in blocks meant to be too small for OpenBLAS to split, so that each call runs whole
    on the thread that makes it."""
    n, a = weight.shape[1], alignment()
    n_threads = threads() if workers() is not None else 1
    edges = [a * round(i * n / (a * n_threads)) for i in range(n_threads + 1)]
    together([partial(_gemv_blocks, weight[:, lo:hi], x, y[:, lo:hi], elements) for lo, hi in zip(edges, edges[1:])])


def exact_linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """x [T, n_in] times weight [n_in, n_out] (+ bias) -> [T, n_out], by matrix-vector products only.
    weight is C-contiguous (a checkpoint's Conv1D) or the transpose of a C-contiguous array (wte.T)."""
    T, n_in = x.shape
    n_out, a, cut = weight.shape[1], alignment(), in_force()
    x = np.ascontiguousarray(x)
    head = n_out - n_out % a  # outputs in calls of a multiple of `a`
    y = np.empty((T, n_out), np.float32)
    if T >= cut.shared_rows:  # [T, head], in blocks shared between minigpt's threads
        _shared(weight[:, :head], x, y[:, :head], cut.shared_block)
    else:  # in blocks that OpenBLAS splits between its threads, each thread's share read once
        _gemv_blocks(weight[:, :head], x, y[:, :head], cut.one_row_block if T == 1 else cut.multi_row_block)
    if head < n_out:  # the last n_out % a outputs, from a zero-padded copy of their weights, a outputs wide
        tail = np.zeros((a, n_in), np.float32).T if _columns(weight) else np.zeros((n_in, a), np.float32)
        tail[:, :n_out - head] = weight[:, head:]
        y[:, head:] = np.matmul(x[:, None], tail)[:, 0, :n_out - head]  # T x ([1, n_in] @ [n_in, a])
    if bias is not None:
        y += bias
    return y
