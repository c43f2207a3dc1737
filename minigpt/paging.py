"""Paged KV memory: one preallocated pool of 16-position pages shared by a batch's sequences.

A cache that reserves a sequence's whole context up front (kv_cache.new_cache) wastes the memory
of every token the sequence never reaches. Serving engines (vLLM's PagedAttention) cut the memory
into fixed-size pages instead: each sequence holds a page table, takes a page when it grows past
the last one, and gives all of them back when it finishes or is preempted. Nothing is reserved for
tokens not yet generated (docs/paging.md).

A GPU kernel follows the page table page by page. NumPy can only multiply arrays it can address
with strides, so minigpt's attention reads a sequence's keys in *runs* of consecutive pages, one
view per run (KVCache.runs); the exact kernel's arithmetic does not depend on where the runs break
(minigpt.kernels, point 4). The pool therefore places pages so that sequences stay in few runs:
a growing sequence takes the page right after its last one when it is free, and a new run starts
in the middle of the largest free gap, leaving room on both sides to grow into.
"""

from __future__ import annotations

import numpy as np

from .config import GPT2Config
from .kernels import PAGE
from .kv_cache import KVCache, new_store, pages_for


class PagePool:
    """n_pages pages of keys and values for every layer, and which of them are free."""

    def __init__(self, config: GPT2Config, n_pages: int):
        self.k, self.v = new_store(config, n_pages)  # [n_layer, n_head, n_pages * PAGE, head_dim]
        self.free = np.ones(n_pages, bool)
        self.peak_in_use = 0

    @property
    def n_pages(self) -> int:
        return self.free.size

    @property
    def in_use(self) -> int:
        return self.n_pages - int(self.free.sum())

    @property
    def page_bytes(self) -> int:
        """Bytes of keys and values one page holds."""
        return (self.k.nbytes + self.v.nbytes) // self.n_pages

    def new_cache(self) -> KVCache:
        """An empty cache whose pages will come from this pool."""
        return KVCache(self.k, self.v, [])

    def grow(self, cache: KVCache, n_positions: int) -> bool:
        """Give `cache` pages until it holds n_positions positions. All or nothing: False, and no
        page taken, when the pool has too few free pages."""
        needed = pages_for(n_positions) - len(cache.pages)
        if needed <= 0:
            return True
        if needed > self.free.sum():
            return False
        for _ in range(needed):
            cache.pages.append(self._take(cache.pages[-1] + 1 if cache.pages else None))
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        return True

    def release(self, cache: KVCache) -> None:
        """Give all of a cache's pages back to the pool; the cache is empty afterwards."""
        self.free[cache.pages] = True
        cache.pages, cache.length = [], 0

    def _take(self, wanted: int | None) -> int:
        """A free page, zeroed: `wanted` if it is free, else the middle of the largest free gap
        (its start when the gap begins the pool)."""
        if wanted is None or wanted >= self.n_pages or not self.free[wanted]:
            start, length = largest_gap(self.free)
            wanted = start if start == 0 else start + length // 2
        self.free[wanted] = False
        self.k[:, :, wanted * PAGE:(wanted + 1) * PAGE] = 0  # a page comes back holding another sequence's keys
        self.v[:, :, wanted * PAGE:(wanted + 1) * PAGE] = 0
        return wanted


def largest_gap(free: np.ndarray) -> tuple[int, int]:
    """(start, length) of the longest run of True in `free` (the first of equals); free has a True."""
    edges = np.diff(np.concatenate([[0], free.astype(np.int8), [0]]))
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    i = int(np.argmax(stops - starts))
    return int(starts[i]), int(stops[i] - starts[i])
