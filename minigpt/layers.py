"""The layers of a GPT-2 block as pure functions over float32 arrays.

Each takes the activations of N positions, [N, C], and the weights of one layer (minigpt.params).
The N rows may belong to several sequences (a batch): everything but attention treats each row
on its own; attention keeps each sequence to its own keys and values (a `Span` per sequence).
Order-sensitive products go through a `Kernels` set (minigpt.kernels), so that the same code runs
with batch-invariant or with plain BLAS arithmetic.

On a first reading, take `kernels.linear` as x @ w.T + b (kernels.fast_linear, picoGPT's `linear`)
and `kernels.attention` as a masked softmax over each sequence's keys (kernels.fast_attention);
the cache that a `Span` writes into comes with minigpt.kv_cache, the exact kernels after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .kernels import Kernels, Queries
from .kv_cache import KVCache
from .params import MLP, Attention, Block, LayerNorm

GELU_C = math.sqrt(2.0 / math.pi)  # a Python float: NEP 50 keeps float32 arrays float32


@dataclass(frozen=True, eq=False)
class Span:
    """One sequence's part of a forward: its rows of the activations, the cache it continues, and
    where its new keys and values go (computed once per forward, used by every layer)."""

    rows: slice  # its rows in the [N, C] activations
    cache: KVCache
    start: int  # its first new position (= the cache's length before the forward)
    slots: np.ndarray  # store slots of the new positions [T]
    runs: list[tuple[int, int]]  # store slot ranges of positions 0 .. start+T-1, in whole pages


def layer_norm(x: np.ndarray, p: LayerNorm, eps: float) -> np.ndarray:
    """Normalise each row to mean 0, variance 1 (biased, as torch), then scale and shift."""
    mean = x.mean(axis=-1, keepdims=True)  # [T, C] -> [T, 1]
    centered = x - mean
    var = (centered * centered).mean(axis=-1, keepdims=True)  # [T, C] -> [T, 1]
    return centered / np.sqrt(var + eps) * p.weight + p.bias


def gelu(x: np.ndarray) -> np.ndarray:
    """GPT-2's GELU, the tanh approximation (Hugging Face's `gelu_new`)."""
    return 0.5 * x * (1.0 + np.tanh(GELU_C * (x + 0.044715 * x * x * x)))


def split_heads(x: np.ndarray, n_head: int) -> np.ndarray:
    T, C = x.shape
    return x.reshape(T, n_head, C // n_head).transpose(1, 0, 2)  # [T, C] -> [n_head, T, head_dim]


def merge_heads(x: np.ndarray) -> np.ndarray:
    n_head, T, head_dim = x.shape
    return x.transpose(1, 0, 2).reshape(T, n_head * head_dim)  # [n_head, T, head_dim] -> [T, C]


def attention(x, p: Attention, n_head: int, layer: int, spans: list[Span], kernels: Kernels, record=False):
    """Causal self-attention for the new positions of every sequence in the batch.

    Each sequence's keys and values are written into its cache at its new positions; its queries
    then attend to its keys from position 0 on, and to nothing of the other sequences.
    Returns the output [N, C] and, with `record`, each sequence's attention weights [n_head, T, start+T].
    """
    qkv = kernels.linear(x, p.c_attn.weight, p.c_attn.bias)  # [N, C] -> [N, 3C]
    q, k, v = (split_heads(a, n_head) for a in np.split(qkv, 3, axis=-1))  # 3 x [n_head, N, head_dim]
    store_keys_values(spans, layer, k, v)
    parts = [Queries(s.rows, s.cache.segments(layer, s.runs), s.start) for s in spans]
    out, weights = kernels.attention(q, parts, record)  # [n_head, N, head_dim]
    return kernels.linear(merge_heads(out), p.c_proj.weight, p.c_proj.bias), weights  # [N, C]


def store_keys_values(spans: list[Span], layer: int, k: np.ndarray, v: np.ndarray) -> None:
    """Write each sequence's new keys and values (rows of k, v [n_head, N, head_dim]) into its cache:
    one scatter per store, since a batch's sequences share their pool's."""
    by_store: dict[int, list[Span]] = {}
    for s in spans:
        by_store.setdefault(id(s.cache.k), []).append(s)
    for group in by_store.values():
        slots = np.concatenate([s.slots for s in group])
        rows = np.concatenate([np.arange(s.rows.start, s.rows.stop) for s in group])
        group[0].cache.k[layer][:, slots] = k[:, rows]  # [n_head, slots, head_dim]
        group[0].cache.v[layer][:, slots] = v[:, rows]


def mlp(x: np.ndarray, p: MLP, kernels: Kernels) -> np.ndarray:
    h = gelu(kernels.linear(x, p.c_fc.weight, p.c_fc.bias))  # [N, C] -> [N, 4C]
    return kernels.linear(h, p.c_proj.weight, p.c_proj.bias)  # [N, 4C] -> [N, C]


def block(x, p: Block, n_head: int, eps: float, layer: int, spans: list[Span], kernels: Kernels, record=False):
    """One transformer block, pre-LayerNorm with residual connections: [N, C] -> [N, C]."""
    a, weights = attention(layer_norm(x, p.ln_1, eps), p.attn, n_head, layer, spans, kernels, record)
    x = x + a
    x = x + mlp(layer_norm(x, p.ln_2, eps), p.mlp, kernels)
    return x, weights
