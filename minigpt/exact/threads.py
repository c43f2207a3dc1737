"""The two numbers that decide the exact kernels' bits, the thread count and the alignment it feeds,
and the worker threads, as many, that share the kernels' work.

Every gemv call computes a multiple of `alignment()` outputs, from the thread count (`threads()`,
as OpenBLAS reads it): that is what makes an output's bits the same at any thread count
(docs/exactness.md, point 2).
"""

from __future__ import annotations

import contextvars
import math
import os
from concurrent.futures import ThreadPoolExecutor, wait
from functools import cache
from typing import Callable, TypeVar


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
def workers() -> ThreadPoolExecutor | None:
    """The worker threads that share the kernels' work with the calling thread (None: it works
    alone), threads() - 1 of them. NumPy releases the GIL inside a matrix product, so they run in parallel."""
    n = threads()
    return ThreadPoolExecutor(n - 1, thread_name_prefix="minigpt-kernels") if n > 1 else None


R = TypeVar("R")  # what a call returns


def together(calls: list[Callable[[], R]]) -> list[R]:
    """Each call's result, the first made by the calling thread and the others by the worker threads
    at the same time, each in the caller's context (its np.errstate). Every call has ended when this
    returns or raises: none goes on writing into shared arrays after an error."""
    if len(calls) == 1:
        return [calls[0]()]
    futures = [workers().submit(contextvars.copy_context().run, call) for call in calls[1:]]
    try:
        first = calls[0]()
    finally:
        wait(futures)
    return [first, *(f.result() for f in futures)]


ALIGN = 64  # outputs per gemv call are a multiple of this and of 16 x threads (docs/exactness.md, point 2)


@cache
def alignment() -> int:
    """Every gemv call computes a multiple of this many outputs: of ALIGN, and of 16 x the thread
    count, so that OpenBLAS's split at ceil(n / threads) gives every thread a multiple of sixteen. With
    the thread count, this is what decides bits; the cut below does not."""
    return math.lcm(ALIGN, 16 * threads())
