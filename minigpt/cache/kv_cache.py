"""The KV cache: every layer's keys and values of the positions a sequence has processed so far.

Under the causal mask an old position never attends to a new one, so its keys and values are the
same at every step: the cache computes them once. `forward_cached` is gpt2.forward with three
changes, marked NEW: positions continue after the cached ones, each layer stores its new keys and
values, and attention reads all of them from the cache. The cache is allocated once for the whole
request and filled in place, never concatenated.

Sources: Inference Engineering (fanout.sh, inference-eng): "The Autoregressive Loop & Cost" (the first fix)
and lesson 03-01, "Why Autoregressive Generation Recomputes Work" (its price in memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..gpt2.config import GPT2Config
from ..gpt2.forward import GPT2, embed, lm_head
from ..gpt2.layers import Kernels, block


@dataclass(eq=False)
class KVCache:
    """Mutable on purpose: forward_cached appends to it."""

    k: np.ndarray  # [n_layer, H, capacity, hd]: each head's keys of positions 0 .. capacity-1 in one stretch
    v: np.ndarray  # [n_layer, H, capacity, hd]
    length: int = 0  # positions 0 .. length-1 hold keys and values

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def layer_attend(self, layer: int, start: int, kernels: Kernels) -> Callable:
        """The attend function `block` calls in `layer`, for new positions from `start` on: it stores
        their keys and values, then attends to every key so far, each head's read in one stretch of memory."""
        def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:  # [H, T, hd] each
            end = start + q.shape[1]
            self.k[layer, :, start:end] = k
            self.v[layer, :, start:end] = v
            return kernels.attend(q, self.k[layer, :, :end], self.v[layer, :, :end])  # [H, end, hd] views
        return attend

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on: a speculative rollback, or a prefix continued another way."""
        self.length = length

    def copy(self) -> KVCache:
        """An independent cache holding the same positions: a fork, to continue two ways."""
        return type(self)(self.k.copy(), self.v.copy(), self.length)


def new_cache(config: GPT2Config, capacity: int) -> KVCache:
    """An empty cache for `capacity` positions (np.zeros maps memory lazily: untouched positions cost no RAM)."""
    shape = (config.n_layer, config.n_head, capacity, config.head_dim)
    return KVCache(np.zeros(shape, np.float32), np.zeros(shape, np.float32))


def forward_cached(gpt: GPT2, ids, cache: KVCache, logits_to_keep: int = 0) -> np.ndarray:
    """Logits for T new token ids after the cache's positions, whose keys and values are appended to it."""
    start = cache.length
    x = embed(gpt.params, ids, start)  # NEW: positions start .. start+T-1
    for layer, p in enumerate(gpt.params.h):
        x = block(x, p, gpt.config, cache.layer_attend(layer, start, gpt.kernels), gpt.kernels.linear)  # NEW
    cache.length = start + len(ids)  # NEW
    return lm_head(gpt, x, logits_to_keep)
