"""A forward that keeps what it computes (each layer's output, new keys and values, attention
weights), for the proof and for naming the layer where an overflow began. It runs gpt2.forward's
own functions with an attend that records, so those forwards stay free of instrumentation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..gpt2.forward import GPT2, embed, lm_head
from ..cache.kv_cache import KVCache
from ..gpt2.layers import block, layer_norm, merge_heads


@dataclass(eq=False)
class Trace:
    """What one forward over T new positions computed."""

    hidden: list[np.ndarray] = field(default_factory=list)  # embeddings, each block's output, ln_f's: [T, C]
    keys: list[np.ndarray] = field(default_factory=list)  # per layer, the new positions' keys [T, C]
    values: list[np.ndarray] = field(default_factory=list)  # per layer [T, C]
    weights: list[np.ndarray] = field(default_factory=list)  # per layer kept [heads kept, T, S], S = start + T
    logits: np.ndarray | None = None  # [T or logits_to_keep, vocab]


def traced_forward(gpt: GPT2, ids, cache: KVCache | None = None, logits_to_keep: int = 0,
                   layers: list[int] | None = None, heads: list[int] | None = None) -> Trace:
    """gpt2.forward (no cache) or kv_cache.forward_cached, recording every layer; the attention
    weights of the heads `heads` (None: all) of the layers `layers` (None: all) only, [H, T, S] each
    being what a long text cannot afford for every head."""
    start, trace = (0 if cache is None else cache.length), Trace()
    x = embed(gpt.params, ids, start)  # [T, C]
    trace.hidden.append(x)
    for layer, p in enumerate(gpt.params.h):
        attend = gpt.kernels.attend if cache is None else cache.layer_attend(layer, start, gpt.kernels)
        kept = heads if layers is None or layer in layers else []
        x = block(x, p, gpt.config, recording(attend, gpt, trace, cache, layer, kept), gpt.kernels.linear)
        trace.hidden.append(x)
    if cache is not None:
        cache.length = start + len(ids)
    trace.hidden.append(layer_norm(x, gpt.params.ln_f, gpt.config.layer_norm_epsilon))
    trace.logits = lm_head(gpt, x, logits_to_keep)
    return trace


def recording(attend: Callable, gpt: GPT2, trace: Trace, cache: KVCache | None, layer: int,
              heads: list[int] | None) -> Callable:
    """`attend`, also keeping the new keys and values it is given and the weights of the queries of
    `heads` (None: every head; []: none, and no weights are kept for the layer)."""
    def attend_and_record(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:  # [H, T, hd] each
        out = attend(q, k, v)
        seen = k if cache is None else cache.k[layer, :, :cache.length + q.shape[1]]  # keys 0 .. S-1
        trace.keys.append(merge_heads(k))
        trace.values.append(merge_heads(v))
        if heads is None:
            trace.weights.append(gpt.kernels.attention_weights(q, seen))
        elif heads:
            trace.weights.append(gpt.kernels.attention_weights(q[heads], seen[heads]))  # [len(heads), T, S]
        return out
    return attend_and_record


def layer_names(n_layer: int, long: bool = False) -> list[str]:
    """The names of Trace.hidden's entries, in order: short ("block 3"), or long, as an error names
    them with their checkpoint tensors ("block 3 (h.3)")."""
    if long:
        return ["the embeddings (wte + wpe)", *(f"block {i} (h.{i})" for i in range(n_layer)), "the final LayerNorm (ln_f)"]
    return ["embeddings", *(f"block {i}" for i in range(n_layer)), "ln_f"]


def first_non_finite(gpt: GPT2, ids, cache: KVCache | None = None) -> str:
    """Where a forward over ids (after the cache's positions) first stopped being finite: the name of
    the first layer whose output holds a NaN or an infinity, else the LM head. The cache's length is
    left as it was."""
    start = 0 if cache is None else cache.length
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            trace = traced_forward(gpt, ids, cache)
    finally:  # an error or Ctrl-C midway too
        if cache is not None:
            cache.length = start
    return next((name for name, x in zip(layer_names(gpt.config.n_layer, long=True), trace.hidden)
                 if not np.isfinite(x).all()),
                "the LM head (the logits, wte)")
