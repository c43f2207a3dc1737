"""check_kernels: the properties that make a kernel set exact, run with Hypothesis against any set
(gpt2.layers.Kernels: a linear map and attention; a Model's set, its attention weights too), minigpt's own
or a reader's.

A kernel set is exact when a row's output bits depend on that row alone (docs/exactness.md):
- not on the other rows of the call: a linear map's row computed with 1-64 others, or alone;
- not on how a prompt is chunked through the cache: attention's queries for the last positions,
  computed with the whole prompt's or alone over the same keys;
- not on the BLAS thread count: the same call at OpenBLAS's count and at one thread, on weights large
  enough for OpenBLAS to split a product between its threads;
- not on the kernels' cut of the weights (minigpt.exact.tuning): the same call under two cuts.
Each property draws shapes and a seed, so that a falsifying example reads as a few numbers.
"""

from __future__ import annotations

import contextlib
import ctypes
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..exact.kernels import BatchKernels
from ..gpt2.layers import Kernels
from ..exact.tuning import OPENBLAS_SPLIT, Tuning, tuned
from .bits import assert_bitwise

cuts = st.builds(Tuning, one_row_block=st.integers(1, 2**23), multi_row_block=st.integers(1, 2**22),
                 shared_block=st.integers(1, 2**21), shared_rows=st.integers(1, 20), gemm_rows=st.integers(1, 20))


def _arrays(seed: int, scale: float, *shapes: tuple[int, ...]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)) for shape in shapes]


def _openblas_threads() -> tuple[Callable, Callable] | None:
    """NumPy's OpenBLAS's (set, get) of its thread count, through ctypes, or None when this process's
    BLAS is not an OpenBLAS that exports them (or the platform has no /proc/self/maps)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    for path in sorted({p for p in maps.read_text().split() if "openblas" in p and ".so" in p}):
        library = ctypes.CDLL(path)
        for prefix, suffix in (("scipy_openblas", "64_"), ("scipy_openblas", ""), ("openblas", "64_"), ("openblas", "")):
            names = f"{prefix}_set_num_threads{suffix}", f"{prefix}_get_num_threads{suffix}"
            if all(hasattr(library, name) for name in names):
                return getattr(library, names[0]), getattr(library, names[1])
    return None


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """OpenBLAS runs n threads inside the block (the whole process's BLAS: nothing else should run
    products meanwhile), then as many as before. minigpt's own count (threads.threads) stays as the
    process started: it decides the exact kernels' alignment, valid at every count up to it."""
    set_threads, get_threads = _openblas_threads()
    before = get_threads()
    set_threads(n)
    try:
        yield
    finally:
        set_threads(before)


def check_kernels(kernels: Kernels, max_examples: int = 50) -> None:
    """Return quietly if `kernels` has the module's four properties (`max_examples` examples each; the
    thread property only on OpenBLAS, else skipped with a warning); else raise the first failure's
    AssertionError, with Hypothesis' shrunk falsifying example in its notes."""
    run = settings(max_examples=max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])

    @run
    @given(rows=st.integers(2, 64), n_in=st.integers(1, 300), n_out=st.integers(1, 300), row=st.integers(0, 63),
           seed=st.integers(0, 2**32 - 1), bias=st.booleans(), head=st.booleans())
    def linear_row_alone_or_with_others(rows, n_in, n_out, row, seed, bias, head):
        row %= rows
        x, w, b = _arrays(seed, 1.0, (rows, n_in), (n_out, n_in) if head else (n_in, n_out), (n_out,))
        w = w.T if head else w  # the tied head's wte.T, or a checkpoint's [n_in, n_out]
        many = kernels.linear(x, w, b if bias else None)  # [rows, n_out]
        alone = kernels.linear(x[row:row + 1], w, b if bias else None)  # [1, n_out]
        assert_bitwise(many[row:row + 1], alone, f"{kernels.name}.linear's row {row} of {rows} vs alone")

    @run
    @given(n_head=st.integers(1, 4), head_dim=st.integers(1, 64), positions=st.integers(2, 200),
           new=st.integers(1, 200), seed=st.integers(0, 2**32 - 1), scale=st.sampled_from([0.1, 1.0, 10.0]))
    def attention_rows_whatever_the_chunking(n_head, head_dim, positions, new, seed, scale):
        new = min(new, positions - 1)  # the cache holds positions - new, the chunk the last `new`
        q, k, v = _arrays(seed, scale, *[(n_head, positions, head_dim)] * 3)
        whole = kernels.attend(q, k, v)[:, -new:]  # the prompt in one prefill: its last rows
        chunk = kernels.attend(q[:, -new:], k, v)  # the last `new` positions after a cache of the others
        assert_bitwise(whole, chunk, f"{kernels.name}.attend's last {new} of {positions} queries, one prefill vs chunked")
        if isinstance(kernels, BatchKernels):
            weights = kernels.attention_weights(q, k)[:, -new:]
            assert_bitwise(weights, kernels.attention_weights(q[:, -new:], k), f"{kernels.name}.attention_weights, chunked")

    @run
    @given(rows=st.integers(1, 4), n_in=st.integers(64, 512), seed=st.integers(0, 2**32 - 1))
    def linear_rows_at_any_thread_count(rows, n_in, seed):
        n_out = -(-2 * OPENBLAS_SPLIT // n_in)  # weights enough for OpenBLAS to split a product between threads
        x, w = _arrays(seed, 1.0, (rows, n_in), (n_in, n_out))
        y = kernels.linear(x, w, None)
        with blas_threads(1):
            one = kernels.linear(x, w, None)
        assert_bitwise(one, y, f"{kernels.name}.linear at 1 BLAS thread vs this process's count")

    @run
    @given(a=cuts, b=cuts, rows=st.integers(1, 40), n_in=st.integers(1, 300), n_out=st.integers(1, 700),
           seed=st.integers(0, 2**32 - 1))
    def linear_rows_under_any_cut(a, b, rows, n_in, n_out, seed):
        x, w = _arrays(seed, 1.0, (rows, n_in), (n_in, n_out))
        with tuned(a):
            ya = kernels.linear(x, w, None)
        with tuned(b):
            yb = kernels.linear(x, w, None)
        assert_bitwise(ya, yb, f"{kernels.name}.linear under two cuts of the weights")

    linear_row_alone_or_with_others()
    attention_rows_whatever_the_chunking()
    if _openblas_threads() is None:
        import warnings
        warnings.warn("check_kernels: NumPy's BLAS is not an OpenBLAS whose thread count can be set: the "
                      "thread-count property was not checked (tests/exact/test_threads.py checks it across processes)")
    else:
        linear_rows_at_any_thread_count()
    linear_rows_under_any_cut()
