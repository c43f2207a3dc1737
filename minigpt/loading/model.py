"""`Model`: a GPT-2 whose forwards check what they are given (minigpt.loading.checks) and name the
layer where an overflow began (tracing.first_non_finite).
"""

from __future__ import annotations

import dataclasses
import os
import reprlib
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from .checks import check_cache, check_parts, check_room
from ..errors import InputError, NumericalError, check_ids, check_int, shown
from ..gpt2.forward import GPT2, forward
from ..exact.kernels import EXACT, BatchKernels
from ..cache.kv_cache import KVCache, forward_cached, new_cache
from ..exact.batched import forward_batch
from ..loop.sequence import check_finite
from ..exact.tracing import first_non_finite

if TYPE_CHECKING:  # the model never tokenizes; it only carries the loader
    from tiktoken import Encoding


@dataclass(frozen=True, eq=False)
class Model(GPT2):
    """A loaded GPT-2: configuration, weights and kernel set (EXACT by default), with checked forwards.
    `.tokenizer` is built on first use (None: a vocabulary not GPT-2's)."""

    kernels: BatchKernels = EXACT
    tokenizer_loader: Callable[[], Encoding] | None = None

    def __post_init__(self) -> None:
        check_parts(self.params, self.config, self.kernels)  # weights of another config: refused at once
        read_only(self.params)  # pages computed from them stay true: the weights cannot change under them

    @cached_property
    def tokenizer(self) -> Encoding | None:
        return None if self.tokenizer_loader is None else self.tokenizer_loader()

    def forward(self, ids, cache: KVCache | None = None, *, logits_to_keep: int = 0) -> np.ndarray:
        """Logits for the T positions of `ids`, float32 [T, vocab_size], continuing after the cache's
        `length` positions and appending their keys and values to it (no cache: from position 0).
        With logits_to_keep = n > 0, those of the last n positions only, [n, vocab_size]."""
        return self.forward_batch([ids], [cache], logits_to_keep=logits_to_keep)[0]

    def forward_batch(self, ids_list, caches, *, logits_to_keep: int = 0) -> list[np.ndarray]:
        """`forward` for several sequences in one pass over the weights, each with its own cache
        (model.new_cache(), a PagePool's, or None): each gets the logits `forward` gives it."""
        if not isinstance(ids_list, (list, tuple)) or not isinstance(caches, (list, tuple)):
            raise InputError(f"forward_batch takes a list of id sequences and a list of caches, got "
                             f"{type(ids_list).__name__} and {type(caches).__name__}")
        if len(ids_list) != len(caches):
            raise InputError(f"forward_batch got {len(ids_list)} id sequences and {len(caches)} caches")
        if len({id(c) for c in caches if c is not None}) < sum(c is not None for c in caches):
            raise InputError("forward_batch got the same cache for two sequences: each needs its own")
        logits_to_keep = check_int(logits_to_keep, "logits_to_keep", 0)
        ids_list = [check_ids(ids, self.config.vocab_size) for ids in ids_list]
        checked = []
        for ids, cache in zip(ids_list, caches):
            if ids.size == 0:
                raise InputError("forward needs at least one token id")
            cache = new_cache(self.config, min(ids.size, self.config.n_positions)) if cache is None \
                else check_cache(self.config, cache)
            check_room(self.config, cache, ids.size)
            checked.append(cache)
        starts = [cache.length for cache in checked]
        with overflow_named_by_layer(self, ids_list[0], checked[0] if isinstance(checked[0], KVCache) else None):
            try:  # an overflow, or Ctrl-C mid-forward: every cache's length as it was, before the layer is named
                if len(ids_list) == 1 and caches[0] is None:  # the whole sequence: part 1's forward
                    logits = [forward(self, ids_list[0], logits_to_keep)]
                elif len(ids_list) == 1 and isinstance(checked[0], KVCache):
                    logits = [forward_cached(self, ids_list[0], checked[0], logits_to_keep)]
                else:
                    logits = forward_batch(self, ids_list, checked, [logits_to_keep] * len(ids_list))
                for row in logits:
                    check_finite(row)
            except BaseException:
                for cache, start in zip(checked, starts):
                    cache.length = start
                raise
        return logits

    def new_cache(self, capacity: int | None = None) -> KVCache:
        """An empty KV cache for `capacity` positions, 1 .. n_positions (default: the whole context)."""
        capacity = self.config.n_positions if capacity is None else check_int(capacity, "capacity", 1)
        if capacity > self.config.n_positions:
            raise InputError(f"capacity must be at most the model's context of {self.config.n_positions} positions "
                             f"(n_positions), got {shown(capacity)}")
        cache = new_cache(self.config, capacity)
        return CheckedCache(cache.k, cache.v)


class CheckedCache(KVCache):
    """model.new_cache()'s KVCache: its truncate refuses a length the cache does not hold."""

    def truncate(self, length: int) -> None:
        if check_int(length, "length", 0) > self.length:
            raise InputError(f"cannot truncate a cache of length {self.length} to {length}")
        super().truncate(length)


def read_only(part) -> None:
    """Make every weight array under a params dataclass read-only (in place)."""
    for f in dataclasses.fields(part):
        value = getattr(part, f.name)
        for item in value if isinstance(value, tuple) else (value,):
            if isinstance(item, np.ndarray):
                item.flags.writeable = False
            else:
                read_only(item)


def with_layer(gpt: GPT2, error: NumericalError, ids, cache: KVCache | None = None) -> NumericalError:
    """`error` naming the first layer whose output stopped being finite, found by tracing the forward
    over ids again (after the cache's positions, whose keys and values it writes again, unchanged)."""
    return NumericalError(f"{error} after {first_non_finite(gpt, ids, cache)}: the weights are finite but too "
                          "large for float32 arithmetic")


@contextmanager
def overflow_named_by_layer(gpt: GPT2, ids, cache: KVCache | None = None) -> Iterator[None]:
    """The block run with overflow warnings off; a NumericalError raised in it names the layer where
    the overflow began. `ids` may be a function giving them (a loop's ids grow)."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            yield
    except NumericalError as e:
        raise with_layer(gpt, e, ids() if callable(ids) else ids, cache) from None


DONE = object()  # what next() gives for a loop that has ended


def steps_overflow_named(gpt: GPT2, steps: Iterator, ids: Callable[[], list[int]]) -> Iterator:
    """The items of a loop, each computed in overflow_named_by_layer over ids()."""
    while True:
        with overflow_named_by_layer(gpt, ids):
            item = next(steps, DONE)
        if item is DONE:
            return
        yield item


def check_model(model: object) -> Model:
    """`model` if it is a Model; else InputError (a name or a path must be loaded first)."""
    if not isinstance(model, Model):
        hint = ": load it first (minigpt.load)" if isinstance(model, (str, os.PathLike)) else ""
        raise InputError(f"model must be a minigpt.Model, got {type(model).__name__} {reprlib.repr(model)}{hint}")
    return model
