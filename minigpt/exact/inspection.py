"""Looking inside one forward: what attention looks at, layer by layer and head by head, the
residual stream after each block, and the logit lens (what the model would predict if it stopped
after each layer). Everything comes from the traced forward the proof uses (minigpt.exact.tracing),
so it is the model's own computation, not a second implementation: with the exact kernels the logits
are bitwise `forward`'s. Pictures of it: `python -m minigpt inspect` (docs/model.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..gpt2.forward import GPT2, lm_head
from ..loop.sampling import log_softmax, top_log_probs
from .tracing import traced_forward


@dataclass(frozen=True, eq=False)
class Inspection:
    """One forward over T token ids, kept for a reader."""

    gpt: GPT2
    ids: list[int]
    attention: np.ndarray  # float32 [n_layer, n_head, T, T]: row t, query t's weights over keys 0 .. T-1
    hidden: np.ndarray  # float32 [n_layer + 1, T, n_embd]: after the embeddings, then after each block
    logits: np.ndarray  # float32 [T, vocab]: row t scores the token after ids[:t + 1]

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


def inspect(gpt: GPT2, ids: list[int]) -> Inspection:
    """One traced forward over ids (no cache), kept as an Inspection."""
    trace = traced_forward(gpt, ids)
    return Inspection(gpt, list(ids), np.stack(trace.weights), np.stack(trace.hidden[:-1]), trace.logits)
