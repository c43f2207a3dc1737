"""The kernel sets a Model runs with: EXACT, whose every row has the same bits whatever else is
computed with it, so that the cache, batching, paging and speculation change no bit (the exact
linear map and attention, minigpt.exact.linear and .attention); and FAST, plain NumPy made quicker
(minigpt.exact.fast). Each carries every operation a forward or a batched forward calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..gpt2.layers import Kernels, attention_weights
from .attention import exact_attend, exact_attend_batch, exact_weights
from .fast import fast_attend, fast_attend_batch, fast_linear
from .linear import exact_linear


@dataclass(frozen=True)
class BatchKernels(Kernels):
    """A kernel set a Model runs on: with the attention weights `attend` uses, which tracing records
    (minigpt.exact.tracing), and the batched forward's operation (minigpt.exact.batched)."""

    attention_weights: Callable  # (q [H, T, hd], k [H, S, hd]) -> [H, T, S]
    attend_batch: Callable  # (q [H, N, hd], [attention.BatchPart, ...]) -> [H, N, hd]: each sequence over its own keys


EXACT = BatchKernels("exact", exact_linear, exact_attend, exact_weights, exact_attend_batch)
FAST = BatchKernels("fast", fast_linear, fast_attend, attention_weights, fast_attend_batch)
KERNELS = {k.name: k for k in (EXACT, FAST)}
