"""Scoring a given text: the log-probability the model gives each of its tokens, and so its
perplexity, the way Hugging Face's perplexity guide computes it.

A text longer than the context is scored in overlapping windows of n_positions tokens that begin
at 0, stride, 2 * stride, ...; each window scores only the tokens the windows before it did not,
so every token is scored once, with at least n_positions - stride tokens of context once the first
window is past (docs/sampling.md). Each row of logits becomes a log-probability by the function
`generate` uses for its new tokens, so with the exact kernels the two agree bit for bit.
"""

from __future__ import annotations

import numpy as np

from .gpt2 import GPT2, forward
from .sampling import token_log_prob
from .sequence import check_finite


def score(gpt: GPT2, ids: np.ndarray, stride: int) -> np.ndarray:
    """float64 [len(ids) - 1]: log P(ids[i] | ids[:i]) for i = 1 .. len(ids) - 1 (ids: at least 2), in
    windows of n_positions tokens advancing by `stride` when the text is longer."""
    n_positions = gpt.config.n_positions
    logprobs = np.empty(ids.size - 1)
    begin, scored = 0, 1  # the window's first token; the first token not scored yet
    while scored < ids.size:
        end = min(begin + n_positions, ids.size)
        logits = forward(gpt, ids[begin:end])  # [end - begin, vocab]: row j predicts ids[begin + j + 1]
        check_finite(logits)
        for i in range(scored, end):
            logprobs[i - 1] = token_log_prob(logits[i - 1 - begin], ids[i])
        begin, scored = begin + stride, end
    return logprobs
