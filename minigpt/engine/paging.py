"""Paged KV memory and the batched forward: one pool of 16-position pages shared by many sequences.

A cache that reserves a sequence's whole context up front (kv_cache.new_cache) wastes the memory
of every token the sequence never reaches. Serving engines (vLLM's PagedAttention) cut the memory
into fixed-size pages instead: each sequence holds a page table, takes a page when it grows past
its last one, and gives all of them back when it finishes or is preempted (docs/paging.md).

`forward_batch` runs several sequences' new positions through the weights together, each
attending to its own keys and values only. The exact kernels read a sequence's keys in place, in
runs of consecutive pages (PagedCache.runs, a forward's Placement); their bits do not depend on where the runs break
(minigpt.exact.kernels, point 4), so a paged, batched sequence gets bitwise gpt2.forward's logits. The
pool places pages so that sequences stay in few runs: a growing sequence takes the page right
after its last one when it is free, and a new run starts in the middle of the largest free gap.
"""

from __future__ import annotations

import math
import mmap
from collections import OrderedDict
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Callable

import numpy as np

from ..gpt2.config import GPT2Config
from ..gpt2.forward import GPT2, embed, lm_head
from ..exact.kernels import PAGE, Queries, Segments, attend_batch
from ..cache.kv_cache import KVCache
from ..gpt2.layers import Kernels, block


def pages_for(n_positions: int) -> int:
    """How many pages hold n_positions positions."""
    return -(-n_positions // PAGE)


def lazy_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """float32 zeros whose memory the kernel commits 4 KiB at a time, as it is first written: an
    anonymous mapping with transparent huge pages turned off, so that writing one KV page of a
    large pool costs that page, not a 2 MiB huge page per layer."""
    count = math.prod(shape)
    memory = mmap.mmap(-1, max(4 * count, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        memory.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(memory, np.float32, count).reshape(shape)


@dataclass(frozen=True, eq=False)
class PageScores:
    """What a prefill computed of one full page of a prompt, kept with the page so that a request
    that wants prompt log-probabilities can reuse it: the log-probability of each of its tokens
    after the first (each given everything before it), their top_n most likely tokens, and the
    logits of its last position, which score whatever token comes after the page."""

    logprobs: tuple[float, ...]  # tokens 1 .. PAGE-1 of the page
    top: tuple | None  # their top_n (id, logprob) lists; None: top_n is 0
    top_n: int
    last_row: np.ndarray  # float32 logits [vocab] of the page's last position


@dataclass(frozen=True, eq=False)
class PageKey:
    """How a full page is found again: the chained hash of its prefix, its own token ids (checked on
    every hit) and, from a prefill that computed them, its scores."""

    hash: bytes
    tokens: tuple[int, ...]
    scores: PageScores | None


class PagePool:
    """n_pages pages of keys and values for every layer. A page is held by the sequences whose
    caches list it (`refs`), kept for its prefix when none holds it (`cached`, least recently used
    first: what is evicted when the pool needs room), or free."""

    def __init__(self, config: GPT2Config, n_pages: int):
        shape = (config.n_layer, n_pages * PAGE, config.n_head, config.head_dim)
        self.k, self.v = lazy_zeros(shape), lazy_zeros(shape)  # [n_layer, n_pages * PAGE, H, hd]: a row per slot
        self.refs = np.zeros(n_pages, np.int64)
        self.free = np.ones(n_pages, bool)
        self.cached: OrderedDict[int, None] = OrderedDict()
        self.keys: dict[int, PageKey] = {}  # page -> its key, for every page in the prefix cache
        self.by_hash: dict[bytes, int] = {}
        self.peak_in_use = self.evictions = 0

    @property
    def n_pages(self) -> int:
        return self.free.size

    @property
    def in_use(self) -> int:
        return self.n_pages - int(self.free.sum()) - len(self.cached)

    @property
    def available(self) -> int:
        """Pages a cache can take: the free ones and the cached ones nobody holds (evicted first)."""
        return int(self.free.sum()) + len(self.cached)

    @property
    def page_bytes(self) -> int:
        """Bytes of keys and values one page holds."""
        return (self.k.nbytes + self.v.nbytes) // self.n_pages

    def new_cache(self) -> PagedCache:
        """An empty cache whose pages will come from this pool."""
        return PagedCache(self)

    def grow(self, cache: PagedCache, n_positions: int) -> bool:
        """Give `cache` pages until it holds n_positions positions. All or nothing: False, and no
        page taken, when the pool has too few free or evictable pages."""
        needed = pages_for(n_positions) - len(cache.pages)
        if needed <= 0:
            return True
        if needed > self.available:
            return False
        for _ in range(needed):
            cache.pages.append(self._take(cache.pages[-1] + 1 if cache.pages else None))
        self.peak_in_use = max(self.peak_in_use, self.in_use)
        return True

    def share(self, cache: PagedCache, page: int) -> None:
        """Append a page found in the prefix cache to `cache`: one more sequence holds it."""
        self.refs[page] += 1
        self.cached.pop(page, None)
        cache.pages.append(page)
        self.peak_in_use = max(self.peak_in_use, self.in_use)

    def release(self, cache: PagedCache) -> None:
        """Let go of all of a cache's pages, the last first (so that a prefix outlives its longer
        continuations in the cache); the cache is empty afterwards. A page nobody holds any more
        stays cached if it is in the prefix cache, else it is free."""
        for page in reversed(cache.pages):
            self.refs[page] -= 1
            if self.refs[page] == 0:
                if page in self.keys:
                    self.cached[page] = None  # the most recently used
                else:
                    self.free[page] = True
        cache.pages, cache.length = [], 0

    def lookup(self, hash: bytes, tokens: tuple[int, ...]) -> int | None:
        """The cached page of this prefix hash, if its token ids are these."""
        page = self.by_hash.get(hash)
        return page if page is not None and self.keys[page].tokens == tokens else None

    def register(self, page: int, key: PageKey) -> None:
        """Put a held, full page into the prefix cache under its key. A page already there for the
        same prefix stays, unless this one brings scores and it has none: then this one replaces it."""
        known = self.by_hash.get(key.hash)
        if known is not None:
            if key.scores is None or self.keys[known].scores is not None:
                return
            self._forget(known)
        self.keys[page], self.by_hash[key.hash] = key, page

    def _forget(self, page: int) -> None:
        """Take a page out of the prefix cache; if nobody holds it, it is free."""
        del self.by_hash[self.keys.pop(page).hash]
        if self.cached.pop(page, False) is None:
            self.free[page] = True

    def _take(self, wanted: int | None) -> int:
        """A page for one more sequence: a free one, `wanted` if it is free, else the middle of the
        largest free gap (its start when the gap begins the pool), so that sequences stay in few
        runs; with none free, the least recently used cached page, evicted. Its slots are zeroed
        (another sequence's old keys may be in them): the exact kernels read a sequence's last page
        whole, in place, its slots past the sequence's length included."""
        if not self.free.any():
            page, _ = self.cached.popitem(last=False)
            del self.by_hash[self.keys.pop(page).hash]
            self.evictions += 1
        else:
            if wanted is None or wanted >= self.n_pages or not self.free[wanted]:
                start, length = largest_gap(self.free)
                wanted = start if start == 0 else start + length // 2
            page = wanted
            self.free[page] = False
        self.refs[page] = 1
        self.k[:, page * PAGE:(page + 1) * PAGE] = 0
        self.v[:, page * PAGE:(page + 1) * PAGE] = 0
        return page


def largest_gap(free: np.ndarray) -> tuple[int, int]:
    """(start, length) of the longest run of True in `free` (the first of equals); free has a True."""
    edges = np.diff(np.concatenate([[0], free.astype(np.int8), [0]]))
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    i = int(np.argmax(stops - starts))
    return int(starts[i]), int(stops[i] - starts[i])


@dataclass(eq=False)
class PagedCache:
    """One sequence's keys and values in a pool: page i of the sequence (positions 16i .. 16i+15)
    lives in the pool's page pages[i]."""

    pool: PagePool
    pages: list[int] = field(default_factory=list)  # the page table
    length: int = 0

    @property
    def capacity(self) -> int:
        return len(self.pages) * PAGE

    @property
    def nbytes(self) -> int:
        return len(self.pages) * self.pool.page_bytes

    def slots(self, start: int, stop: int) -> np.ndarray | slice:
        """The pool slots of positions start .. stop-1: a slice when they follow each other (a
        decode step's one position; a prefill's within a run of pages), which is faster to write."""
        positions = np.arange(start, stop)
        slots = np.asarray(self.pages)[positions // PAGE] * PAGE + positions % PAGE
        return slice(int(slots[0]), int(slots[-1]) + 1) if slots.size and (np.diff(slots) == 1).all() else slots

    def runs(self, n: int) -> list[tuple[int, int]]:
        """The pool slot ranges [a, b) of the whole pages that hold positions 0 .. n-1, one per run
        of consecutive pages."""
        runs: list[list[int]] = []
        for page in self.pages[:pages_for(n)]:
            if runs and runs[-1][1] == page * PAGE:
                runs[-1][1] += PAGE
            else:
                runs.append([page * PAGE, (page + 1) * PAGE])
        return [(a, b) for a, b in runs]


@dataclass(frozen=True, eq=False)
class Placement:
    """Where one sequence's keys and values lie for one forward, the same in every layer: the store,
    the slots its new positions go to, and the slot ranges of every position so far."""

    k: np.ndarray  # [n_layer, slots, H, hd]
    v: np.ndarray
    new: np.ndarray | slice  # the new positions' slots
    length: int  # positions so far, the new ones included
    runs: list[tuple[int, int]]  # the whole pages of positions 0 .. length-1, in order

    def segments(self, layer: int) -> Segments:
        """The keys and values of every position so far, head by head: views [H, n, hd] of the store."""
        return [(self.k[layer, a:b].transpose(1, 0, 2), self.v[layer, a:b].transpose(1, 0, 2)) for a, b in self.runs]


Write = tuple[np.ndarray, np.ndarray, np.ndarray | slice, np.ndarray | slice]  # k and v stores, slots, rows


def writes(placements: list[Placement], rows: list[slice]) -> list[Write]:
    """Where a forward's new keys and values go, one write per store (a pool's, for all its sequences
    at once): (its k and v stores [n_layer, slots, H, hd], the slots written, the forward's rows
    that fill them)."""
    by_store: dict[int, list[tuple[Placement, slice]]] = {}
    for place, r in zip(placements, rows):
        by_store.setdefault(id(place.k), []).append((place, r))
    out = []
    for group in by_store.values():
        place = group[0][0]
        if len(group) == 1:
            out.append((place.k, place.v, place.new, group[0][1]))
        else:
            slots = [np.arange(p.new.start, p.new.stop) if isinstance(p.new, slice) else p.new for p, _ in group]
            filled = [np.arange(r.start, r.stop) for _, r in group]
            out.append((place.k, place.v, np.concatenate(slots), np.concatenate(filled)))
    return out


def placement(cache: KVCache | PagedCache, n: int) -> Placement:
    """The Placement of n new positions after a cache's: a KVCache's are one contiguous run (to the
    end of its last page, if the cache has room), a pool's follow its page table."""
    start, end = cache.length, cache.length + n
    if isinstance(cache, KVCache):
        whole = PAGE * pages_for(end)
        return Placement(cache.k, cache.v, slice(start, end), end, [(0, whole if whole <= cache.capacity else end)])
    return Placement(cache.pool.k, cache.pool.v, cache.slots(start, end), end, cache.runs(end))


def clear_page_tail(cache: KVCache | PagedCache, end: int) -> None:
    """Zero the slots of positions end .. the end of their page if one holds anything but zero bits
    (a length set back by hand, a forward stopped midway): the exact kernels read a sequence's last
    page whole, those slots included (minigpt.exact.kernels, point 4). Model.forward does it before each
    forward; the library's own loops never leave anything there."""
    stop = min(cache.capacity, PAGE * pages_for(end))
    if end >= stop:
        return
    if isinstance(cache, KVCache):
        k, v, slots = cache.k, cache.v, slice(end, stop)
    else:
        k, v, slots = cache.pool.k, cache.pool.v, cache.slots(end, stop)  # within one page: a slice
    if np.count_nonzero(v[:, slots].view(np.uint32)) or np.count_nonzero(k[:, slots].view(np.uint32)):
        k[:, slots], v[:, slots] = 0, 0


def batch_attend(layer: int, placements: list[Placement], rows: list[slice], stores: list[Write],
                 kernels: Kernels) -> Callable:
    """The attend of `layer` for a batch: the new keys and values written where `stores` (`writes`)
    says, then every sequence's queries attend to their own keys, in one call of the kernels."""
    def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:  # [H, N, hd] each
        k, v = k.transpose(1, 0, 2), v.transpose(1, 0, 2)  # [N, H, hd]: a row per position, as stored
        for k_store, v_store, slots, r in stores:
            k_store[layer][slots], v_store[layer][slots] = k[r], v[r]
        parts = [Queries(r, place.length, place.segments(layer)) for place, r in zip(placements, rows)]
        return attend_batch(kernels, q, parts)  # [H, N, hd]
    return attend


def forward_batch(gpt: GPT2, ids_list: list, caches: list, keep: list[int]) -> list[np.ndarray]:
    """One forward over several sequences, each continuing its own cache (a pool's PagedCache or a
    KVCache) with its own ids: every weight is read once for all of them (docs/batching.md).
    Returns each sequence's logits, as forward_cached would with logits_to_keep=keep[i] (0: all
    rows): [T_i or keep[i], vocab]."""
    sizes = [len(ids) for ids in ids_list]
    edges = list(accumulate(sizes, initial=0))
    rows = [slice(a, b) for a, b in zip(edges, edges[1:])]
    placements = [placement(cache, n) for cache, n in zip(caches, sizes)]  # once, for every layer
    stores = writes(placements, rows)
    x = np.concatenate([embed(gpt.params, ids, cache.length) for ids, cache in zip(ids_list, caches)])  # [N, C]
    for layer, p in enumerate(gpt.params.h):
        attend = batch_attend(layer, placements, rows, stores, gpt.kernels)
        x = block(x, p, gpt.config, attend, gpt.kernels.linear)  # [N, C]
    for cache, n in zip(caches, sizes):
        cache.length += n
    kept = [min(n, k) if k else n for n, k in zip(sizes, keep)]
    x = x[np.concatenate([np.arange(r.stop - n, r.stop) for r, n in zip(rows, kept)])]  # [kept rows, C]
    return np.split(lm_head(gpt, x), np.cumsum(kept)[:-1])
