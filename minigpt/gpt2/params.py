"""GPT-2's weights as small frozen dataclasses, named exactly as in Hugging Face checkpoints.

`params.h[3].attn.c_attn.weight` is the checkpoint's tensor `h.3.attn.c_attn.weight` as stored: a
linear layer's weight is [n_in, n_out] (Conv1D), so a layer computes `x @ weight + bias`; the tied
LM head `wte` is [vocab_size, C].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)  # holds arrays: no elementwise ==
class Linear:
    weight: np.ndarray  # [n_in, n_out]
    bias: np.ndarray  # [n_out]


@dataclass(frozen=True, eq=False)
class LayerNorm:
    weight: np.ndarray  # [C], the gain
    bias: np.ndarray  # [C]


@dataclass(frozen=True, eq=False)
class Attention:
    c_attn: Linear  # C -> 3C: queries, keys and values of all heads at once
    c_proj: Linear  # C -> C


@dataclass(frozen=True, eq=False)
class MLP:
    c_fc: Linear  # C -> 4C
    c_proj: Linear  # 4C -> C


@dataclass(frozen=True, eq=False)
class Block:
    ln_1: LayerNorm
    attn: Attention
    ln_2: LayerNorm
    mlp: MLP


@dataclass(frozen=True, eq=False)
class GPT2Params:
    wte: np.ndarray  # [vocab_size, C]: token embeddings, and (tied) the LM head
    wpe: np.ndarray  # [n_positions, C]: position embeddings
    h: tuple[Block, ...]  # n_layer blocks
    ln_f: LayerNorm
