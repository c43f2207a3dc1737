"""The batched forward: several sequences' new positions through the weights together, each
attending to its own keys and values only, every weight read once for all of them (docs/batching.md).

The exact kernels read a sequence's keys in place, in runs of consecutive slots (a forward's
Placement); their bits do not depend on where the runs break (minigpt.exact.attention),
so a paged, batched sequence gets bitwise gpt2.forward's logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Callable, Protocol

import numpy as np

from ..cache.kv_cache import KVCache
from ..gpt2.forward import GPT2, embed, lm_head
from ..gpt2.layers import block
from .attention import BatchPart, Segments
from .kernels import BatchKernels


@dataclass(frozen=True, eq=False)
class Placement:
    """Where one sequence's keys and values lie for one forward, the same in every layer: the store,
    the slots its new positions go to, and the slot ranges of every position so far."""

    k: np.ndarray  # [n_layer, H, slots, hd]
    v: np.ndarray
    new_slots: np.ndarray | slice  # the new positions' slots
    length: int  # positions so far, the new ones included
    runs: list[tuple[int, int]]  # the slots of positions 0 .. length-1, in order (a pool's: whole pages)

    def segments(self, layer: int) -> Segments:
        """The keys and values of every position so far, head by head: views [H, n, hd] of the store."""
        return [(self.k[layer, :, a:b], self.v[layer, :, a:b]) for a, b in self.runs]


Write = tuple[np.ndarray, np.ndarray, np.ndarray | slice, np.ndarray | slice]  # k and v stores, slots, q's rows


def writes(placements: list[Placement], rows: list[slice]) -> list[Write]:
    """Where a forward's new keys and values go, one write per store (a pool's, for all its sequences
    at once): (its k and v stores [n_layer, H, slots, hd], the slots written, the forward's rows
    that fill them)."""
    by_store: dict[int, list[tuple[Placement, slice]]] = {}
    for place, r in zip(placements, rows):
        by_store.setdefault(id(place.k), []).append((place, r))
    out = []
    for group in by_store.values():
        place = group[0][0]
        if len(group) == 1:
            out.append((place.k, place.v, place.new_slots, group[0][1]))
        else:
            slots = [np.arange(p.new_slots.start, p.new_slots.stop) if isinstance(p.new_slots, slice) else p.new_slots
                     for p, _ in group]
            filled = [np.arange(r.start, r.stop) for _, r in group]
            out.append((place.k, place.v, np.concatenate(slots), np.concatenate(filled)))
    return out


class Cache(Protocol):
    """What the batched forward asks of a cache: a KVCache, or one whose positions lie in its store
    in several runs (a page pool's, minigpt.engine.paging), which says where with runs(n)."""

    k: np.ndarray  # [n_layer, H, slots, hd]: the store its keys lie in
    v: np.ndarray
    length: int


def placement(cache: Cache, n: int) -> Placement:
    """The Placement of n new positions after a cache's: their slots, read off the runs (a slice when
    they follow each other, which writes faster)."""
    start, end = cache.length, cache.length + n
    # where positions 0 .. end-1 lie in the store, as ranges of its slots (its third axis), in order
    runs = [(0, end)] if isinstance(cache, KVCache) else cache.runs(end)
    parts, first = [], 0  # first: the position a run begins with
    for a, b in runs:
        lo, hi = max(start, first), min(end, first + b - a)  # the new positions in this run
        if lo < hi:
            parts.append(np.arange(a + lo - first, a + hi - first))
        first += b - a
    slots = np.concatenate(parts)
    new_slots = slice(int(slots[0]), int(slots[-1]) + 1) if (np.diff(slots) == 1).all() else slots
    return Placement(cache.k, cache.v, new_slots, end, runs)


def batch_attend(layer: int, placements: list[Placement], rows: list[slice], stores: list[Write],
                 kernels: BatchKernels) -> Callable:
    """The attend of `layer` for a batch: the new keys and values written where `stores` (`writes`)
    says, then every sequence's queries attend to their own keys, in one call of the kernels."""
    def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:  # [H, N, hd] each
        for k_store, v_store, slots, r in stores:
            k_store[layer][:, slots], v_store[layer][:, slots] = k[:, r], v[:, r]
        parts = [BatchPart(r, place.length, place.segments(layer)) for place, r in zip(placements, rows)]
        return kernels.attend_batch(q, parts)  # [H, N, hd]
    return attend


def forward_batch(gpt: GPT2, ids_list: list, caches: list[Cache], keep: list[int]) -> list[np.ndarray]:
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
