"""The GPT-2 forward pass for one sequence: token ids in, next-token logits out.

Every call computes every position from scratch; that is the naive generation loop of "The
Autoregressive Loop & Cost" (minigpt.loop.loops). minigpt.cache.kv_cache adds what a cache changes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import GPT2Config
from .layers import PLAIN, Kernels, block, layer_norm
from .params import GPT2Params


@dataclass(frozen=True, eq=False)
class GPT2:
    """A GPT-2: hyperparameters, weights, and the kernel set that does its order-sensitive arithmetic."""

    config: GPT2Config
    params: GPT2Params
    kernels: Kernels = PLAIN


def embed(params: GPT2Params, ids, start: int = 0) -> np.ndarray:
    """Token plus position embeddings of ids at positions start, start + 1, ...: [T] -> [T, C]."""
    return params.wte[ids] + params.wpe[start:start + len(ids)]


def lm_head(gpt: GPT2, x: np.ndarray, logits_to_keep: int = 0) -> np.ndarray:
    """The final LayerNorm and the tied LM head over the last logits_to_keep rows (0: all): [T, C] ->
    [kept, vocab]. A decode step needs one row, and wte is the largest matrix."""
    x = layer_norm(x[-logits_to_keep:], gpt.params.ln_f, gpt.config.layer_norm_epsilon)  # [kept, C]
    # wte.T is a view, no copy: a product with it is one dot product per token over wte's contiguous rows
    return gpt.kernels.linear(x, gpt.params.wte.T, None)  # [kept, C] @ [C, vocab] -> [kept, vocab]


def forward(gpt: GPT2, ids, logits_to_keep: int = 0) -> np.ndarray:
    """Logits for T token ids: row t is the distribution of the token after ids[:t + 1]. [T] -> [T, vocab]."""
    x = embed(gpt.params, ids)  # [T, C]
    for p in gpt.params.h:
        x = block(x, p, gpt.config, gpt.kernels.attend, gpt.kernels.linear)  # [T, C]
    return lm_head(gpt, x, logits_to_keep)
