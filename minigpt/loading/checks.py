"""Validation, once, at the public boundary: the checks of what a caller gives a model (its config,
weights, caches, room in its context, a scoring stride).

The functions of parts 1 to 4 assume checked input; Model, the requests, the Engine, minigpt.api.api
and the CLI call these first. Each raises a minigpt.errors class naming the argument and what would fit.
"""

from __future__ import annotations

import weakref

import numpy as np

from ..gpt2.config import GPT2Config
from ..errors import ConfigError, ContextLengthError, InputError, check_int, is_int, shown
from ..cache.kv_cache import KVCache
from ..exact.kernels import BatchKernels
from ..gpt2.params import GPT2Params
from .weights import expected_shapes, params_to_tensors

SIZE_FIELDS = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")  # integers >= 1, required in a config.json


def check_config(config: object) -> GPT2Config:
    """`config` if it is a GPT2Config whose fields make a GPT-2; else ConfigError naming the field."""
    if not isinstance(config, GPT2Config):
        raise InputError(f"config must be a GPT2Config, got {type(config).__name__}")
    for name in SIZE_FIELDS:
        if not is_int(value := getattr(config, name)) or value < 1:
            raise ConfigError(f"config field {name!r} must be an integer >= 1, got {shown(value)}")
    if config.n_embd % config.n_head:
        raise ConfigError(f"config field 'n_embd' ({config.n_embd}) must be divisible by 'n_head' ({config.n_head})")
    eps = config.layer_norm_epsilon
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
        raise ConfigError(f"config field 'layer_norm_epsilon' must be a number in (0, 1), got {eps!r}")
    eos = config.eos_token_id
    if eos is not None and (not is_int(eos) or not 0 <= eos < config.vocab_size):
        raise ConfigError(f"config field 'eos_token_id' must be an integer in [0, {config.vocab_size}), got {eos!r}")
    return config


def check_params(params: object, config: GPT2Config) -> None:
    """InputError unless `params` are GPT2Params holding float32 tensors of exactly `config`'s shapes:
    weights of another model would fail inside NumPy or, with only the layer count different, run
    silently. It names the first tensor that does not fit."""
    if not isinstance(params, GPT2Params):
        raise InputError(f"params must be GPT2Params (minigpt.gpt2.params), got {type(params).__name__}")
    if len(params.h) != config.n_layer:
        raise InputError(f"the weights have {len(params.h)} layer(s) and the config {config.n_layer} (n_layer): "
                         "they belong to another model")
    shapes = expected_shapes(config)
    for name, value in params_to_tensors(params).items():
        if not isinstance(value, np.ndarray) or value.dtype != np.float32 or value.shape != shapes[name]:
            raise InputError(f"the weights' tensor {name!r} is {type(value).__name__} {getattr(value, 'dtype', '')} "
                             f"{list(np.shape(value))}, expected float32 {list(shapes[name])} from the config: "
                             "the weights belong to another model")



_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # GPT2Params -> the config they were checked for


def check_parts(params: object, config: object, kernels: object) -> None:
    """InputError unless the config, weights and kernel set are of their types and the weights have
    the config's shapes (checked once per config: GPT2Params are frozen)."""
    check_config(config)
    if not isinstance(kernels, BatchKernels):
        raise InputError(f"kernels must be a kernel set (minigpt.exact.kernels.EXACT or FAST), got {kernels!r}")
    if not isinstance(params, GPT2Params) or _CHECKED.get(params) is not config:
        check_params(params, config)
        _CHECKED[params] = config


POOLED = ("k", "v", "length", "capacity", "runs", "fault")  # what a pool's cache has (minigpt.engine.paging)


def check_cache(config: GPT2Config, cache: object) -> KVCache:
    """`cache` if it fits this model (its length then a Python int), a KVCache or a pool's cache;
    else InputError naming what does not fit."""
    pooled = not isinstance(cache, KVCache)
    if pooled and not all(hasattr(cache, name) for name in POOLED):
        raise InputError(f"cache must be a KVCache (model.new_cache()), got {type(cache).__name__}")
    arrays = {"k": cache.k, "v": cache.v}
    for name, a in arrays.items():
        if not isinstance(a, np.ndarray) or a.dtype != np.float32 or a.ndim != 4 or not a.flags.writeable:
            raise InputError(f"the cache's {name} store must be a writable float32 array [n_layer, n_head, "
                             f"positions, head_dim], got {type(a).__name__} {getattr(a, 'dtype', '')} {np.shape(a)}")
    k, v = arrays["k"], arrays["v"]
    if v.shape != k.shape:
        raise InputError(f"the cache's k and v stores differ in shape: {k.shape} and {v.shape}")
    if np.may_share_memory(k, v):
        raise InputError("the cache's k and v stores share memory: values would overwrite keys")
    made = dict(zip(("n_layer", "n_head", "head_dim"), (k.shape[0], k.shape[1], k.shape[3])))
    wanted = {"n_layer": config.n_layer, "n_head": config.n_head, "head_dim": config.head_dim}
    if made != wanted:
        differ = ", ".join(f"{n} {made[n]} (this model: {wanted[n]})" for n in made if made[n] != wanted[n])
        raise InputError(f"the cache was made for another model: its {differ}; a cache's stores are [n_layer, "
                         f"n_head, positions, head_dim], got {k.shape}")
    if not pooled and cache.capacity > config.n_positions:
        raise InputError(f"the cache holds {cache.capacity} positions, beyond this model's context of "
                         f"{config.n_positions} (n_positions): it was made for another model")
    fault = cache.fault() if pooled else None
    if fault is not None:
        raise InputError(f"the cache's {fault}")
    if isinstance(cache.length, bool) or not isinstance(cache.length, (int, np.integer)) \
            or not 0 <= cache.length <= cache.capacity:
        raise InputError(f"the cache's length {cache.length!r} is not in 0..{cache.capacity} (its capacity)")
    cache.length = int(cache.length)  # a NumPy integer's sums would wrap past its range
    return cache


def check_room(config: GPT2Config, cache: KVCache, T: int) -> None:
    """ContextLengthError unless T new positions fit after the cached ones."""
    start = cache.length
    if start + T > min(config.n_positions, cache.capacity):
        limit = (f"the context of {config.n_positions} (n_positions)" if cache.capacity >= config.n_positions
                 else f"the cache's capacity of {cache.capacity}")
        raise ContextLengthError(f"{start} cached + {T} new positions exceed {limit}")


def check_stride(stride, n_positions: int) -> int:
    """The tokens each window after the first scores: default n_positions // 2 (at least 1); 1 .. n_positions."""
    if stride is None:
        return max(1, n_positions // 2)
    return check_int(stride, "stride", 1, n_positions)
