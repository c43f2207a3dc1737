"""The KV cache: every layer's keys and values for the positions processed so far.

Preallocated once for the whole context (no per-step concatenation); `length` says how many
positions hold real keys and values. Its capacity is rounded up to a whole number of
`KEY_BLOCK`s so that the exact attention kernel's padded key blocks exist (they stay finite:
zeros or stale keys, masked to weight 0.0).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import GPT2Config
from .kernels import KEY_BLOCK


@dataclass(eq=False)
class KVCache:
    """Mutable on purpose: `forward` appends to it. k, v: [n_layer, n_head, capacity, head_dim]."""

    k: np.ndarray
    v: np.ndarray
    length: int = 0

    @property
    def capacity(self) -> int:
        return self.k.shape[2]

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


def new_cache(config: GPT2Config, capacity: int | None = None) -> KVCache:
    """An empty cache for `capacity` positions (default: the whole context, n_positions)."""
    capacity = config.n_positions if capacity is None else capacity
    capacity = -(-capacity // KEY_BLOCK) * KEY_BLOCK  # round up to whole key blocks
    shape = (config.n_layer, config.n_head, capacity, config.head_dim)
    return KVCache(np.zeros(shape, np.float32), np.zeros(shape, np.float32))
