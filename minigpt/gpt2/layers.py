"""The layers of a GPT-2 block as pure functions over float32 arrays [T, C] (T positions, C = n_embd).

Two operations decide the order of floating-point sums, and so the last bits of the results: the
linear map and attention. They are passed in as a `Kernels` set; `PLAIN` holds the plain NumPy ones
below; minigpt.exact.kernels has `EXACT`, which gives every row the same bits whatever else is computed
with it (docs/exactness.md), and `FAST`, these made quicker where plain NumPy is slow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .config import GPT2Config
from .params import MLP, Attention, Block, LayerNorm

GELU_C = math.sqrt(2.0 / math.pi)  # a Python float: NEP 50 keeps float32 arrays float32


def layer_norm(x: np.ndarray, p: LayerNorm, eps: float) -> np.ndarray:
    """Normalise each row to mean 0, variance 1 (biased, as torch), then scale and shift."""
    n = x.shape[-1]
    centered = x - x.sum(axis=-1, keepdims=True) / n  # [T, C] - [T, 1] (the mean)
    var = (centered * centered).sum(axis=-1, keepdims=True) / n  # [T, 1]
    return centered / np.sqrt(var + eps) * p.weight + p.bias


def gelu(x: np.ndarray) -> np.ndarray:
    """GPT-2's GELU, the tanh approximation (Hugging Face's `gelu_new`):
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in one temporary array."""
    t = 0.044715 * x * x
    t *= x  # 0.044715 x^3
    t += x
    t *= GELU_C
    np.tanh(t, out=t)
    t += 1.0
    t *= x
    t *= 0.5
    return t


def linear(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
    """x [T, n_in] @ weight [n_in, n_out] + bias -> [T, n_out]: one BLAS product for all rows."""
    y = x @ weight
    if bias is not None:
        y += bias
    return y


def attention_weights(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(head_dim)) under the causal mask: q [H, T, hd], k [H, S, hd] -> [H, T, S].

    The T queries are the last T of the S positions: query i is position S - T + i and sees the
    keys 0 .. S - T + i; a later key gets the score -inf, so its weight is exactly 0.
    """
    T, S = q.shape[1], k.shape[1]
    scores = q @ k.transpose(0, 2, 1)  # [H, T, S]
    scores /= np.float32(math.sqrt(q.shape[-1]))
    if T > 1:  # the future: key > query (a single query, the last position, has none)
        np.copyto(scores, -np.inf, where=np.arange(S) > np.arange(S - T, S)[:, None])
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def attend(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Causal attention: each query's weighted sum of the values it sees, [H, T, hd]."""
    return attention_weights(q, k) @ v  # [H, T, S] @ [H, S, hd] -> [H, T, hd]


@dataclass(frozen=True)
class Kernels:
    """The order-sensitive operations a forward calls; another set can replace them."""

    name: str
    linear: Callable  # (x [T, n_in], weight [n_in, n_out], bias [n_out] | None) -> [T, n_out]
    attend: Callable  # (q [H, T, hd], k [H, S, hd], v [H, S, hd]) -> [H, T, hd]


PLAIN = Kernels("plain", linear, attend)  # what everyone writes; not batch-invariant


def split_heads(x: np.ndarray, n_head: int) -> np.ndarray:
    T, C = x.shape
    return x.reshape(T, n_head, C // n_head).transpose(1, 0, 2)  # [T, C] -> [H, T, hd]


def merge_heads(x: np.ndarray) -> np.ndarray:
    H, T, hd = x.shape
    return x.transpose(1, 0, 2).reshape(T, H * hd)  # [H, T, hd] -> [T, C]


def self_attention(x: np.ndarray, p: Attention, n_head: int, attend: Callable, linear: Callable) -> np.ndarray:
    """Causal self-attention, [T, C] -> [T, C]. `attend(q, k, v)` is given the new positions' queries,
    keys and values and decides which keys they see: these alone, or with a cache's (minigpt.cache.kv_cache)."""
    qkv, C = linear(x, p.c_attn.weight, p.c_attn.bias), x.shape[-1]  # [T, 3C]
    q, k, v = qkv[:, :C], qkv[:, C:2 * C], qkv[:, 2 * C:]  # 3 x [T, C]
    out = attend(split_heads(q, n_head), split_heads(k, n_head), split_heads(v, n_head))  # [H, T, hd]
    return linear(merge_heads(out), p.c_proj.weight, p.c_proj.bias)  # [T, C]


def mlp(x: np.ndarray, p: MLP, linear: Callable) -> np.ndarray:
    h = gelu(linear(x, p.c_fc.weight, p.c_fc.bias))  # [T, C] -> [T, 4C]
    return linear(h, p.c_proj.weight, p.c_proj.bias)  # [T, 4C] -> [T, C]


def block(x: np.ndarray, p: Block, config: GPT2Config, attend: Callable, linear: Callable) -> np.ndarray:
    """One transformer block, pre-LayerNorm with residual connections: [T, C] -> [T, C]."""
    eps = config.layer_norm_epsilon
    x = x + self_attention(layer_norm(x, p.ln_1, eps), p.attn, config.n_head, attend, linear)
    return x + mlp(layer_norm(x, p.ln_2, eps), p.mlp, linear)
