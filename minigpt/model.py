"""The GPT-2 forward pass: token ids in, next-token logits out. Pure: it opens no files.

There is one forward. Without a cache it works in a fresh, throwaway cache sized to the input,
which is exactly the naive loop: every call recomputes every position. With a cache that
persists between calls it computes only the new positions and attends to the stored keys and
values. Both run the same lines below; see docs/exactness.md for why their numbers agree bit for
bit with the default (exact) kernels.
"""

from __future__ import annotations

import os
import reprlib
import weakref
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Callable

import numpy as np

from .config import GPT2Config
from .errors import ContextLengthError, InputError, NumericalError, check_int, shown
from .kernels import EXACT, PAGE, Kernels
from .kv_cache import KVCache, new_cache, pages_for
from .layers import Span, block, layer_norm
from .params import GPT2Params, check_params

if TYPE_CHECKING:  # the model never tokenizes; it only carries the loader
    from tiktoken import Encoding


@dataclass(eq=False)
class Trace:
    """What a forward may record for inspection (minigpt.causal_proof reads it).

    hidden: the embeddings, each block's output and the final LayerNorm's output, each [T, C];
    attention: each layer's attention weights, [n_head, T, start + T].
    """

    hidden: list[np.ndarray] = field(default_factory=list)
    attention: list[np.ndarray] = field(default_factory=list)


def forward(params: GPT2Params, config: GPT2Config, kernels: Kernels, ids, cache: KVCache | None = None,
            *, logits_to_keep: int = 0, trace: Trace | None = None) -> np.ndarray:
    """Logits for the positions of `ids`, continuing after the `cache.length` cached positions.

    ids: T token ids. Returns float32 [T, vocab_size], or with `logits_to_keep` n > 0 those of the
    last n positions only, [n, vocab_size] (the LM head, the largest matrix, is then applied to those
    rows alone: a decode step needs 1, a speculative verification k + 1). With a cache, the new
    positions' keys and values are appended to it. One sequence is a batch of one: `forward_batch`.
    """
    return forward_batch(params, config, kernels, [ids], [cache], logits_to_keep=logits_to_keep, trace=trace)[0]


def forward_batch(params: GPT2Params, config: GPT2Config, kernels: Kernels, ids_list, caches,
                  *, logits_to_keep: int = 0, trace: Trace | None = None) -> list[np.ndarray]:
    """One forward over several sequences at once: each continues its own cache with its own ids.

    Every sequence's rows go through the weight matrices together (one read of each weight for
    all of them, docs/batching.md); each attends only to its own keys and values. Returns each
    sequence's logits, as `forward` would (None for a cache: a throwaway cache sized to its ids).
    Logits that are not finite raise a NumericalError naming the first layer that overflowed;
    the caches are then left as they were, as after any interruption (Ctrl-C) mid-forward.
    """
    check_parts(params, config, kernels)
    if not isinstance(ids_list, (list, tuple)) or not isinstance(caches, (list, tuple)):
        raise InputError(f"forward_batch takes a list of id sequences and a list of caches, got "
                         f"{type(ids_list).__name__} and {type(caches).__name__}")
    if len(ids_list) != len(caches):
        raise InputError(f"forward_batch got {len(ids_list)} id sequences and {len(caches)} caches")
    if trace is not None and (not isinstance(trace, Trace) or len(ids_list) != 1):
        raise InputError(f"a trace is a Trace and records one sequence's forward, got {type(trace).__name__}")
    if len({id(cache) for cache in caches if cache is not None}) < sum(cache is not None for cache in caches):
        raise InputError("forward_batch got the same cache for two sequences: each needs its own")
    logits_to_keep = check_int(logits_to_keep, "logits_to_keep", 0)
    ids_list = [check_ids(ids, config.vocab_size) for ids in ids_list]
    spans, row = [], 0
    for ids, cache in zip(ids_list, caches):
        T = len(ids)
        if T == 0:
            raise InputError("forward needs at least one token id")
        cache = new_cache(config, min(T, config.n_positions)) if cache is None else check_cache(config, cache)
        check_room(config, cache, T)
        start = cache.length
        spans.append(Span(slice(row, row + T), cache, start, cache.slots(start, start + T), cache.runs(start + T)))
        row += T
    sizes = [s.rows.stop - s.rows.start for s in spans]  # logits kept per sequence
    try:
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is caught below as one error
            x = transformer(params, config, kernels, ids_list, spans, trace)  # [N, C]
            if logits_to_keep:
                sizes = [min(n, logits_to_keep) for n in sizes]
                kept = np.concatenate([np.arange(s.rows.stop - n, s.rows.stop) for s, n in zip(spans, sizes)])
                x = x[kept]  # [N, C] -> [kept rows, C]
            logits = kernels.linear(x, params.wte, None)  # tied LM head: [rows, C] @ [C, vocab] -> [rows, vocab]
        if not np.isfinite(logits).all():  # [rows, vocab]: a few microseconds beside the LM head's product
            where = first_non_finite(params, config, kernels, ids_list, spans)
            raise NumericalError(f"the activations are not finite (NaN or infinity) after {where}: the weights "
                                 "are finite but too large for float32 arithmetic")
    except BaseException:  # an overflow, or Ctrl-C mid-forward: the new positions' slots back to +0.0,
        for s in spans:  # the caches as they were (every slot past a cache's length holds +0.0)
            s.cache.k[:, :, s.slots] = 0
            s.cache.v[:, :, s.slots] = 0
        raise
    for s in spans:
        s.cache.length = s.rows.stop - s.rows.start + s.start
    return np.split(logits, np.cumsum(sizes)[:-1])


def transformer(params: GPT2Params, config: GPT2Config, kernels: Kernels, ids_list: list[np.ndarray],
                spans: list[Span], trace: Trace | None) -> np.ndarray:
    """The layers below the LM head: embeddings, blocks, final LayerNorm; [N] ids -> [N, C].
    Writes the new positions' keys and values into the caches (their lengths are the caller's)."""
    record = trace is not None
    x = np.concatenate([params.wte[ids] + params.wpe[s.start:s.start + len(ids)]
                        for ids, s in zip(ids_list, spans)])  # [N] -> [N, C]
    if record:
        trace.hidden.append(x)
    for layer, p in enumerate(params.h):
        x, weights = block(x, p, config.n_head, config.layer_norm_epsilon, layer, spans, kernels, record)  # [N, C]
        if record:
            trace.hidden.append(x)
            trace.attention.append(weights[0])
    x = layer_norm(x, params.ln_f, config.layer_norm_epsilon)  # [N, C]
    if record:
        trace.hidden.append(x)
    return x


def first_non_finite(params: GPT2Params, config: GPT2Config, kernels: Kernels, ids_list: list[np.ndarray],
                     spans: list[Span]) -> str:
    """Where a forward's activations first stopped being finite: it is run again, recorded (it writes
    the same keys and values into the same slots), and each layer's output looked at in order."""
    trace = Trace()
    with np.errstate(over="ignore", invalid="ignore"):
        transformer(params, config, kernels, ids_list, spans, trace)
    names = ["the embeddings (wte + wpe)", *(f"block {i} (h.{i})" for i in range(config.n_layer)),
             "the final LayerNorm (ln_f)"]
    return next((name for name, x in zip(names, trace.hidden) if not np.isfinite(x).all()),
                "the LM head (the logits, wte)")


# ------------------------------------------------------- checking what a forward is given


_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # GPT2Params -> the config they were checked for


def check_parts(params: GPT2Params, config: GPT2Config, kernels: Kernels) -> None:
    """InputError unless the config, weights and kernel set are of their types and the weights
    have the config's shapes (check_params). GPT2Params are frozen, so weights are checked once per
    config, not at every decode step (148 tensors: 68 us against a 10 ms step for GPT-2 small)."""
    if not isinstance(config, GPT2Config):
        raise InputError(f"config must be a GPT2Config, got {type(config).__name__}")
    if not isinstance(kernels, Kernels):
        raise InputError(f"kernels must be a Kernels set (minigpt.kernels.EXACT or FAST), got {kernels!r}")
    if not isinstance(params, GPT2Params) or _CHECKED.get(params) is not config:  # once per weights and config
        check_params(params, config)
        _CHECKED[params] = config


def check_ids(ids, vocab_size: int) -> np.ndarray:
    """Token ids as a 1-D int64 array, or InputError naming the first offending id.

    Only integers are ids: floats (even 2.0), bools and strings are refused, never cast.
    """
    if isinstance(ids, (str, bytes)):
        raise InputError(f"token ids must be integers, got the text {reprlib.repr(ids)}; encode it first "
                         "(minigpt.encode)")
    arr = np.array(ids, dtype=object)  # element by element, whatever the sequence holds
    if arr.ndim != 1:
        raise InputError(f"token ids must be a 1-D sequence, got {type(ids).__name__} of shape {arr.shape}")
    for i, t in enumerate(arr.tolist()):
        if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
            raise InputError(f"token id at index {i} is {shown(t)}, not an integer")
        if not 0 <= t < vocab_size:
            raise InputError(f"token id {shown(t)} at index {i} is outside [0, {vocab_size})")
    return arr.astype(np.int64)


def check_room(config: GPT2Config, cache: KVCache, T: int) -> None:
    """ContextLengthError unless T new positions fit after the cached ones."""
    start = cache.length
    if start + T > min(config.n_positions, cache.capacity):
        limit = (f"the context of {config.n_positions} (n_positions)" if cache.capacity >= config.n_positions
                 else f"the cache's capacity of {cache.capacity}")
        raise ContextLengthError(f"{start} cached + {T} new positions exceed {limit}")


def check_cache(config: GPT2Config, cache) -> KVCache:
    """`cache` if it fits this model; else InputError naming what does not fit.

    A cache made by a model of other shapes would fail inside NumPy or, with only the layer count
    different, be silently accepted: its keys and values are not this model's.
    """
    if not isinstance(cache, KVCache):
        raise InputError(f"cache must be a KVCache (model.new_cache()), got {type(cache).__name__}")
    store = {"k": cache.k, "v": cache.v}
    for name, a in store.items():
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.ndim != 4 or a.shape[2] % PAGE \
                or not a.flags.writeable:
            raise InputError(f"the cache's {name} store must be a writable float32 array [n_layer, n_head, slots, "
                             f"head_dim] of whole pages of {PAGE}, got {type(a).__name__} "
                             f"{getattr(a, 'dtype', '')} {np.shape(a)}")
    n_layer, n_head, slots, head_dim = cache.k.shape
    if cache.v.shape != cache.k.shape:
        raise InputError(f"the cache's k and v stores differ in shape: {cache.k.shape} and {cache.v.shape}")
    if np.may_share_memory(cache.k, cache.v):
        raise InputError("the cache's k and v stores share memory: values would overwrite keys")
    made = {"n_layer": n_layer, "n_head": n_head, "head_dim": head_dim}
    wanted = {"n_layer": config.n_layer, "n_head": config.n_head, "head_dim": config.head_dim}
    if made != wanted:
        differ = ", ".join(f"{k} {made[k]} (this model: {wanted[k]})" for k in made if made[k] != wanted[k])
        raise InputError(f"the cache was made for another model: its {differ}")
    if cache.capacity > pages_for(config.n_positions) * PAGE:
        raise InputError(f"the cache holds {cache.capacity} positions, beyond this model's context of "
                         f"{config.n_positions} (n_positions): it was made for another model")
    if not all(isinstance(p, (int, np.integer)) and 0 <= p < slots // PAGE for p in cache.pages):
        raise InputError(f"the cache's page table {cache.pages} points outside its store of {slots // PAGE} pages")
    if len(set(cache.pages)) != len(cache.pages):
        raise InputError(f"the cache's page table {cache.pages} holds a page twice: two positions would share a slot")
    if isinstance(cache.length, bool) or not isinstance(cache.length, (int, np.integer)) \
            or not 0 <= cache.length <= cache.capacity:
        raise InputError(f"the cache's length {cache.length!r} is not in 0..{cache.capacity} (its capacity)")
    return cache


@dataclass(frozen=True, eq=False)
class Model:
    """A loaded GPT-2: configuration, weights and kernel set, with the forward bound.

    The tokenizer is built on first use of `.tokenizer` by `tokenizer_loader` (None: the model has no
    tokenizer, e.g. a test checkpoint whose vocabulary is not GPT-2's), so that work on token ids
    alone never needs GPT-2's BPE tables.
    """

    config: GPT2Config
    params: GPT2Params
    kernels: Kernels = EXACT
    tokenizer_loader: Callable[[], Encoding] | None = None

    def __post_init__(self) -> None:
        check_parts(self.params, self.config, self.kernels)  # weights of another config: refused at once

    @cached_property
    def tokenizer(self) -> Encoding | None:
        return None if self.tokenizer_loader is None else self.tokenizer_loader()

    def forward(self, ids, cache: KVCache | None = None, *, logits_to_keep: int = 0,
                trace: Trace | None = None) -> np.ndarray:
        return forward(self.params, self.config, self.kernels, ids, cache, logits_to_keep=logits_to_keep, trace=trace)

    def forward_batch(self, ids_list, caches, *, logits_to_keep: int = 0) -> list[np.ndarray]:
        return forward_batch(self.params, self.config, self.kernels, ids_list, caches, logits_to_keep=logits_to_keep)

    def new_cache(self, capacity: int | None = None) -> KVCache:
        return new_cache(self.config, capacity)


def check_model(model: object) -> Model:
    """`model` if it is a Model; else InputError (a name or a path must be loaded first)."""
    if not isinstance(model, Model):
        hint = ": load it first (minigpt.load)" if isinstance(model, (str, os.PathLike)) else ""
        raise InputError(f"model must be a minigpt.Model, got {type(model).__name__} {reprlib.repr(model)}{hint}")
    return model
