"""Scoring a given text: the log-probability the model gives each of its tokens, and so its
perplexity. A text longer than n_positions + 1 tokens is scored in windows of n_positions tokens,
each scoring the `stride` tokens after those already scored (lm-evaluation-harness's rolling windows
at stride = n_positions; docs/sampling.md). A row's log-probability is computed as `generate`
computes its new tokens', so with the exact kernels the two agree bit for bit.
"""

from __future__ import annotations

import numpy as np

from ..gpt2.forward import GPT2, forward
from ..loop.sampling import token_log_prob
from ..loop.sequence import check_finite


def score(gpt: GPT2, ids: np.ndarray, stride: int) -> np.ndarray:
    """float64 [len(ids) - 1]: log P(ids[i] | ids[:i]) for ids of at least 2 tokens."""
    n_positions = gpt.config.n_positions
    logprobs = np.empty(ids.size - 1)
    first, last = 1, min(n_positions, ids.size - 1)  # the window's first and last token to score
    while True:
        begin = max(0, last - n_positions)
        logits = forward(gpt, ids[begin:last])  # [last - begin, vocab]: row j predicts ids[begin + j + 1]
        check_finite(logits)
        for i in range(first, last + 1):
            logprobs[i - 1] = token_log_prob(logits[i - 1 - begin], ids[i])
        if last == ids.size - 1:
            return logprobs
        first, last = last + 1, min(last + stride, ids.size - 1)
