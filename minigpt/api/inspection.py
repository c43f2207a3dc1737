"""Looking inside one forward: each head's attention, the residual stream after each block, and
the logit lens, all from the traced forward (minigpt.exact.tracing), the model's own computation
(docs/model.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..gpt2.forward import GPT2, embed, lm_head
from ..gpt2.layers import block
from ..loop.sampling import log_softmax, top_log_probs
from ..exact.tracing import Trace, recording, traced_forward


@dataclass(frozen=True, eq=False)
class Inspection:
    """One forward over T token ids, kept for a reader."""

    gpt: GPT2
    ids: list[int]
    attention: np.ndarray  # float32 [len(layers), len(heads), T, T]: row t, query t's weights over keys 0 .. T-1
    hidden: np.ndarray  # float32 [n_layer + 1, T, n_embd]: after the embeddings, then after each block
    logits: np.ndarray  # float32 [T, vocab]: row t scores the token after ids[:t + 1]
    layers: list[int]  # the layers whose attention is kept (default: every one)
    heads: list[int]  # the heads of each of them whose attention is kept (default: every one)

    def logit_lens(self, top: int = 5) -> tuple[np.ndarray, np.ndarray]:
        """(ids int64, probs float64), each [n_layer + 1, T, top]: at every layer and position, the
        `top` most likely next tokens if the final LayerNorm and the LM head read that layer's hidden
        state (most likely first, ties to the lower id). The last layer's is the model's prediction."""
        L, T = self.hidden.shape[:2]
        ids, probs = np.empty((L, T, top), np.int64), np.empty((L, T, top), np.float64)
        for layer, h in enumerate(self.hidden):
            logits = lm_head(self.gpt, h)  # [T, vocab]
            for t, row in enumerate(logits):
                best = top_log_probs(log_softmax(row), top)
                ids[layer, t], probs[layer, t] = [i for i, _ in best], np.exp([lp for _, lp in best])
        return ids, probs


def inspect(gpt: GPT2, ids: list[int], layers: list[int] | None = None, heads: list[int] | None = None) -> Inspection:
    """One traced forward over ids (no cache), kept as an Inspection, with the attention of the heads
    `heads` of the layers `layers` (None: all; [H, T, T] per layer is what a long text cannot afford)."""
    layers = list(range(gpt.config.n_layer)) if layers is None else list(layers)
    heads = list(range(gpt.config.n_head)) if heads is None else list(heads)
    trace = traced_forward(gpt, ids, layers=layers, heads=heads)
    T = len(ids)
    attention = np.stack(trace.weights) if trace.weights else np.empty((len(layers), len(heads), T, T), np.float32)
    return Inspection(gpt, list(ids), attention, np.stack(trace.hidden[:-1]), trace.logits, layers, heads)


def attention(gpt: GPT2, ids: list[int], layer: int, head: int) -> np.ndarray:
    """float32 [T, T]: inspect(gpt, ids).attention[layer, head] (bitwise with the exact kernels), at
    the cost of that head alone: the blocks up to `layer`, that head's weights, nothing kept of the
    rest (memory O(T * n_embd + n_head * T^2), never the logits or every layer's [H, T, T])."""
    trace = Trace()
    x = embed(gpt.params, ids, 0)  # [T, C]
    for p in gpt.params.h[:layer]:
        x = block(x, p, gpt.config, gpt.kernels.attend, gpt.kernels.linear)
    block(x, gpt.params.h[layer], gpt.config, recording(gpt.kernels.attend, gpt, trace, None, layer, [head]),
          gpt.kernels.linear)
    return trace.weights[0][0]
