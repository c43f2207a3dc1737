"""Paged KV memory: one pool of pages (PAGE positions each) shared by many sequences, and the prefix cache.

As vLLM's PagedAttention, each sequence holds a page table instead of a whole context up front,
takes a page as it grows and gives them all back when it finishes or is preempted (docs/paging.md).
As nano-vllm's block manager, the pool is also the prefix cache: a full page is kept under the
chained hash of its prefix and evicted least recently used once nobody holds it
(docs/prefix-cache.md). Pages are placed so that sequences stay in few runs, which the exact
kernels read in place.
"""

from __future__ import annotations

import math
import mmap
import hashlib
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ..gpt2.config import GPT2Config
from ..exact.attention import TILE
from ..loop.cost import gpt2_architecture, kv_bytes_per_token

PAGE = TILE  # positions per page: one tile of the exact attention's keys, which it reads whole, in place


def pages_for(n_positions: int) -> int:
    """How many pages hold n_positions positions."""
    return -(-n_positions // PAGE)


def page_tokens(ids, i: int) -> tuple[int, ...]:
    """The token ids of a sequence's page i (positions PAGE*i .. PAGE*(i+1)-1)."""
    return tuple(ids[i * PAGE:(i + 1) * PAGE])


def page_hash(parent: bytes, tokens: tuple[int, ...]) -> bytes:
    """The chained hash of a full page: its parent page's hash and its own token ids."""
    return hashlib.blake2b(parent + np.asarray(tokens, np.int64).tobytes(), digest_size=16).digest()


def chained_hashes(parent: bytes, ids, first: int, stop: int) -> list[bytes]:
    """The hashes of pages first .. stop-1 of ids, chained from `parent` (page first-1's hash, or the
    root's): each page's hash stands for its tokens and every token before them."""
    hashes = []
    for i in range(first, stop):
        parent = page_hash(parent, page_tokens(ids, i))
        hashes.append(parent)
    return hashes


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
class PrefixEntry:
    """A full page's entry in the prefix cache: the chained hash of its prefix, its own token ids
    (compared on every hit) and, from a prefill that computed them, its scores."""

    hash: bytes
    tokens: tuple[int, ...]
    scores: PageScores | None


class PagePool:
    """n_pages pages of keys and values for every layer. A page is held by the sequences whose
    caches list it (`refs`), kept for its prefix when none holds it (`cached`, least recently used
    first: what is evicted when the pool needs room), or free."""

    def __init__(self, config: GPT2Config, n_pages: int):
        self.config, self.n_pages = config, n_pages
        shape = (config.n_layer, config.n_head, n_pages * PAGE, config.head_dim)
        self.k, self.v = lazy_zeros(shape), lazy_zeros(shape)  # [n_layer, H, n_pages * PAGE, hd]: a slot per position
        self.refs = np.zeros(n_pages, np.int64)
        self.free = np.ones(n_pages, bool)
        self.cached: OrderedDict[int, None] = OrderedDict()
        self.entries: dict[int, PrefixEntry] = {}  # page -> its entry, for every page in the prefix cache
        self.by_hash: dict[bytes, int] = {}
        self.peak_in_use = self.evictions = 0

    @property
    def in_use(self) -> int:
        return self.n_pages - int(self.free.sum()) - len(self.cached)

    @property
    def page_bytes(self) -> int:
        """Bytes of keys and values one page holds."""
        return PAGE * kv_bytes_per_token(gpt2_architecture("pool", self.config))

    def grow(self, cache: PagedCache, n_positions: int) -> bool:
        """Give `cache` pages until it holds n_positions positions. All or nothing: False, and no
        page taken, when the pool has too few free or evictable pages."""
        needed = pages_for(n_positions) - len(cache.pages)
        if needed <= 0:
            return True
        if needed > int(self.free.sum()) + len(self.cached):  # free pages, and cached ones nobody holds (evicted first)
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
                if page in self.entries:
                    self.cached[page] = None  # the most recently used
                else:
                    self.free[page] = True
        cache.pages, cache._length = [], 0  # not the length's setter: pages kept for their prefix keep their keys

    def lookup(self, hash: bytes, tokens: tuple[int, ...]) -> int | None:
        """The cached page of this prefix hash, if its token ids are these."""
        page = self.by_hash.get(hash)
        return page if page is not None and self.entries[page].tokens == tokens else None

    def register(self, page: int, entry: PrefixEntry) -> None:
        """Put a held, full page into the prefix cache under its entry. A page already there for the
        same prefix stays, unless this one brings scores and it has none: then this one replaces it."""
        known = self.by_hash.get(entry.hash)
        if known is not None:
            if entry.scores is None or self.entries[known].scores is not None:
                return
            self._forget(known)
        self.entries[page], self.by_hash[entry.hash] = entry, page

    def _forget(self, page: int) -> None:
        """Take a page out of the prefix cache; if nobody holds it, it is free."""
        del self.by_hash[self.entries.pop(page).hash]
        if self.cached.pop(page, False) is None:
            self.free[page] = True

    def _take(self, wanted: int | None) -> int:
        """A page for one more sequence: `wanted` if it is free, else the middle of the largest free
        gap (docs/paging.md), else the least recently used cached page, evicted. Its slots are zeroed:
        the exact kernels read a sequence's last page whole, past its length included."""
        if not self.free.any():
            page, _ = self.cached.popitem(last=False)
            del self.by_hash[self.entries.pop(page).hash]
            self.evictions += 1
        else:
            if wanted is None or wanted >= self.n_pages or not self.free[wanted]:
                start, length = largest_gap(self.free)
                wanted = start if start == 0 else start + length // 2
            page = wanted
            self.free[page] = False
        self.refs[page] = 1
        self.k[:, :, page * PAGE:(page + 1) * PAGE] = 0
        self.v[:, :, page * PAGE:(page + 1) * PAGE] = 0
        return page


def largest_gap(free: np.ndarray) -> tuple[int, int]:
    """(start, length) of the longest run of True in `free` (the first of equals); free has a True."""
    edges = np.diff(np.concatenate([[0], free.astype(np.int8), [0]]))
    starts, stops = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    i = int(np.argmax(stops - starts))
    return int(starts[i]), int(stops[i] - starts[i])


class PagedCache:
    """One sequence's keys and values in a pool: page i of the sequence (positions 16i .. 16i+15)
    lives in the pool's page pages[i]. The slots of its last page past its length hold zeros, which
    the exact kernels read whole, in place: a page comes zeroed from the pool, and setting the length
    back zeroes what it forgets."""

    def __init__(self, pool: PagePool, pages: list[int] | None = None, length: int = 0):
        self.pool, self.pages, self._length = pool, [] if pages is None else pages, length  # pages: the page table
        self.k, self.v = pool.k, pool.v  # the store its keys and values lie in: the pool's

    @property
    def length(self) -> int:
        return self._length

    @length.setter
    def length(self, n: int) -> None:
        if n < self._length:
            slots = self.slots(n, self._length)
            self.pool.k[:, :, slots], self.pool.v[:, :, slots] = 0, 0
        self._length = n

    @property
    def capacity(self) -> int:
        return len(self.pages) * PAGE

    @property
    def nbytes(self) -> int:
        return len(self.pages) * self.pool.page_bytes

    def fault(self) -> str | None:
        """What makes this cache unusable, for the boundary to refuse it (minigpt.loading.checks): a
        page table pointing outside the pool or holding a page twice; None if nothing."""
        n = self.pool.n_pages
        if not all(isinstance(p, (int, np.integer)) and not isinstance(p, bool) and 0 <= p < n for p in self.pages):
            return f"page table {self.pages} points outside its pool of {n} pages"
        if len(set(self.pages)) != len(self.pages):
            return f"page table {self.pages} holds a page twice: two positions would share a slot"
        return None

    def slots(self, start: int, stop: int) -> np.ndarray | slice:
        """The pool slots of positions start .. stop-1: a slice when they follow each other."""
        positions = np.arange(start, stop)
        slots = np.asarray(self.pages, np.int64)[positions // PAGE] * PAGE + positions % PAGE
        return slice(int(slots[0]), int(slots[-1]) + 1) if slots.size and (np.diff(slots) == 1).all() else slots

    def runs(self, n: int) -> list[tuple[int, int]]:
        """The pool slot ranges [a, b) of the whole pages that hold positions 0 .. n-1, one per run
        of consecutive pages."""
        runs: list[list[int]] = []
        for page in map(int, self.pages[:pages_for(n)]):  # a NumPy integer's products could wrap
            if runs and runs[-1][1] == page * PAGE:
                runs[-1][1] += PAGE
            else:
                runs.append([page * PAGE, (page + 1) * PAGE])
        return [(a, b) for a, b in runs]
