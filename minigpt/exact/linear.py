"""The exact linear map: x @ weight.T by matrix-vector products, every row's bits the same
whatever other rows are computed with it and however many threads compute them.

1. `exact_linear` multiplies each row by the weights on its own, by matrix-vector products
   (gemv), never by one matrix-matrix product (gemm), whose rounding depends on the row count.
2. Every gemv call computes a multiple of `alignment()` outputs, so that OpenBLAS's split of a
   call between its threads gives each thread a multiple of four: every output then takes the
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


def _gemv_blocks(weight: np.ndarray, x: np.ndarray, y: np.ndarray, elements: int) -> None:
    """y = x @ weight.T for weight [m, n_in] (m a multiple of alignment()), x [T, n_in], into y [T, m]:
    the weight's rows cut into nearly equal blocks of about `elements` weights (a multiple of
    alignment() rows each), one gemv per block and row, block-major, so that a block is read from
    memory once and from cache for the other rows."""
    m, n_in = weight.shape
    if m == 0:
        return
    T, a = x.shape[0], alignment()
    n_blocks = max(1, round(m * n_in / max(elements, 1)))
    cols = a * -(-m // (a * n_blocks))  # rows of weight per block
    full = m // cols * cols
    for first, blocks in ((0, weight[:full].reshape(full // cols, cols, n_in)), (full, weight[full:][None])):
        nb, c, _ = blocks.shape
        if not c:
            continue
        # `out` block-major and contiguous: NumPy loops in the order of the output's memory. One
        # row of y (its outputs contiguous) is that order already, so the products go straight in.
        if T == 1:
            np.matmul(blocks[:, None], x[None, :, :, None], out=y[0, first:first + nb * c].reshape(nb, 1, c, 1))
        else:
            out = np.matmul(blocks[:, None], x[None, :, :, None])  # nb x T x ([c, n_in] @ [n_in, 1])
            y[:, first:first + nb * c] = out[..., 0].transpose(1, 0, 2).reshape(T, nb * c)


def _shared(weight: np.ndarray, x: np.ndarray, y: np.ndarray, elements: int) -> None:
    """_gemv_blocks with weight's rows split between minigpt's threads at multiples of alignment(),
    each share in blocks meant to be too small for OpenBLAS to split, so that each call runs whole
    on the thread that makes it."""
    n, a = weight.shape[0], alignment()
    n_threads = threads() if workers() is not None else 1
    edges = [a * round(i * n / (a * n_threads)) for i in range(n_threads + 1)]
    together([partial(_gemv_blocks, weight[lo:hi], x, y[:, lo:hi], elements) for lo, hi in zip(edges, edges[1:])])


def exact_linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """x [T, n_in] times weight [n_out, n_in] (+ bias) -> [T, n_out], by matrix-vector products only."""
    T, n_in = x.shape
    n_out, a, cut = weight.shape[0], alignment(), in_force()
    x = np.ascontiguousarray(x)
    head = n_out - n_out % a  # outputs in calls of a multiple of `a`
    y = np.empty((T, n_out), np.float32)
    if T >= cut.shared_rows:  # [T, head], in blocks shared between minigpt's threads
        _shared(weight[:head], x, y[:, :head], cut.shared_block)
    else:  # in blocks that OpenBLAS splits between its threads, each thread's share read once
        _gemv_blocks(weight[:head], x, y[:, :head], cut.one_row_block if T == 1 else cut.multi_row_block)
    if head < n_out:  # the last n_out % a outputs, from a zero-padded a-row copy of their weights
        tail = np.zeros((a, n_in), np.float32)
        tail[:n_out - head] = weight[head:]
        y[:, head:] = np.matmul(tail[None], x[:, :, None])[:, :n_out - head, 0]  # T x ([a, n_in] @ [n_in, 1])
    if bias is not None:
        y += bias
    return y


