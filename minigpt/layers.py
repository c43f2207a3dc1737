"""The layers of a GPT-2 block as pure functions over float32 arrays.

Each takes the activations of T positions, [T, C], and the weights of one layer (minigpt.params).
Order-sensitive products go through a `Kernels` set (minigpt.kernels), so that the same code runs
with row-invariant or with plain BLAS arithmetic.
"""

from __future__ import annotations

import math

import numpy as np

from .kernels import Kernels
from .params import MLP, Attention, Block, LayerNorm

GELU_C = math.sqrt(2.0 / math.pi)  # a Python float: NEP 50 keeps float32 arrays float32


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


def attention(x, p: Attention, n_head: int, k_buf, v_buf, start: int, kernels: Kernels, record=False):
    """Causal self-attention for positions start .. start+T-1.

    Their keys and values are written into the buffers (a KV cache layer, [n_head, capacity,
    head_dim]) at those positions; the queries then attend to every key from position 0 on.
    Returns the output [T, C] and, with `record`, the attention weights [n_head, T, start+T].
    """
    T = x.shape[0]
    qkv = kernels.linear(x, p.c_attn.weight, p.c_attn.bias)  # [T, C] -> [T, 3C]
    q, k, v = (split_heads(a, n_head) for a in np.split(qkv, 3, axis=-1))  # 3 x [n_head, T, head_dim]
    k_buf[:, start:start + T] = k
    v_buf[:, start:start + T] = v
    out, weights = kernels.attention(q, k_buf, v_buf, start, record)  # [n_head, T, head_dim]
    return kernels.linear(merge_heads(out), p.c_proj.weight, p.c_proj.bias), weights  # [T, C]


def mlp(x: np.ndarray, p: MLP, kernels: Kernels) -> np.ndarray:
    h = gelu(kernels.linear(x, p.c_fc.weight, p.c_fc.bias))  # [T, C] -> [T, 4C]
    return kernels.linear(h, p.c_proj.weight, p.c_proj.bias)  # [T, 4C] -> [T, C]


def block(x, p: Block, n_head: int, eps: float, k_buf, v_buf, start: int, kernels: Kernels, record=False):
    """One transformer block, pre-LayerNorm with residual connections: [T, C] -> [T, C]."""
    a, weights = attention(layer_norm(x, p.ln_1, eps), p.attn, n_head, k_buf, v_buf, start, kernels, record)
    x = x + a
    x = x + mlp(layer_norm(x, p.ln_2, eps), p.mlp, kernels)
    return x, weights
