"""The KV cache: every layer's keys and values for the positions a sequence has processed so far.

Keys and values live in a *store*, [n_layer, n_head, slots, head_dim], cut into pages of PAGE = 16
positions. A sequence's cache is a page table into that store: page i of the sequence (positions
16i .. 16i+15) lives in the store's page `pages[i]`. `new_cache` gives one sequence a store of its
own whose table is simply 0, 1, 2, ...: allocated once for the whole request, filled in place,
never concatenated. A batch's sequences share one store through minigpt.paging, taking pages as
they grow.

`length` says how many positions hold real keys and values. Every slot past it holds +0.0
(fresh pages are zeroed, rolled-back positions are zeroed again), so that what the exact attention
kernel reads in a padded last page is the same in every run (minigpt.kernels, point 4).

Sources: Inference Engineering (fanout.sh, inference-eng): "The Autoregressive Loop & Cost" (the first fix)
and lesson 03-01, "Why Autoregressive Generation Recomputes Work" (its price in memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .config import GPT2Config
from .errors import InputError, check_int, shown
from .kernels import PAGE, Segments


def pages_for(n_positions: int) -> int:
    """How many pages hold n_positions positions."""
    return -(-n_positions // PAGE)


@dataclass(eq=False)
class KVCache:
    """Mutable on purpose: `forward` appends to it. k, v: the store, [n_layer, n_head, slots, head_dim]."""

    k: np.ndarray
    v: np.ndarray
    pages: list[int] = field(default_factory=list)  # the page table: store page of each sequence page
    length: int = 0

    @property
    def capacity(self) -> int:
        """Positions this sequence can hold with the pages it has."""
        return len(self.pages) * PAGE

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values this sequence's pages hold."""
        return 2 * self.k.itemsize * self.k.shape[0] * self.k.shape[1] * self.capacity * self.k.shape[3]

    def slots(self, start: int, stop: int) -> np.ndarray:
        """Store slots of positions start .. stop-1."""
        positions = np.arange(start, stop)
        return np.asarray(self.pages)[positions // PAGE] * PAGE + positions % PAGE

    def runs(self, n_positions: int) -> list[tuple[int, int]]:
        """Store slot ranges [a, b) holding positions 0 .. n_positions-1 (rounded up to whole pages):
        consecutive store pages merged into one run."""
        runs: list[tuple[int, int]] = []
        for page in self.pages[:pages_for(n_positions)]:
            a = page * PAGE
            if runs and runs[-1][1] == a:
                runs[-1] = (runs[-1][0], a + PAGE)
            else:
                runs.append((a, a + PAGE))
        return runs

    def segments(self, layer: int, runs: list[tuple[int, int]]) -> Segments:
        """One layer's keys and values over `runs` (see `runs`), as views of the store."""
        return [(self.k[layer][:, a:b], self.v[layer][:, a:b]) for a, b in runs]

    def read(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Every layer's keys and values of positions start .. stop-1: [n_layer, n_head, stop-start, head_dim]."""
        slots = self.slots(start, stop)
        return self.k[:, :, slots], self.v[:, :, slots]

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (a speculative rollback): their slots are zeroed."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a cache of length {self.length} to {length}")
        slots = self.slots(length, self.length)
        self.k[:, :, slots] = 0
        self.v[:, :, slots] = 0
        self.length = length


def new_store(config: GPT2Config, n_pages: int) -> tuple[np.ndarray, np.ndarray]:
    """Zeroed keys and values for n_pages pages. np.zeros maps fresh memory lazily: untouched pages
    of a large store cost no RAM."""
    shape = (config.n_layer, config.n_head, n_pages * PAGE, config.head_dim)
    return np.zeros(shape, np.float32), np.zeros(shape, np.float32)


def new_cache(config: GPT2Config, capacity: int | None = None) -> KVCache:
    """An empty cache with a store of its own for `capacity` positions, 1 .. n_positions (default: the
    whole context), rounded up to whole pages."""
    if not isinstance(config, GPT2Config):
        raise InputError(f"new_cache takes the model's GPT2Config (model.config), got {type(config).__name__}; "
                         "or call model.new_cache(capacity)")
    capacity = config.n_positions if capacity is None else check_int(capacity, "capacity", 1)
    if capacity > config.n_positions:
        raise InputError(f"capacity must be at most the model's context of {config.n_positions} positions "
                         f"(n_positions), got {shown(capacity)}")
    n_pages = pages_for(capacity)
    return KVCache(*new_store(config, n_pages), list(range(n_pages)))
