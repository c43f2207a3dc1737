"""Scoring a given text: the log-probability the model gives each of its tokens, and so its
perplexity.

A forward over n_positions tokens predicts n_positions tokens (its last row predicts the token
after it), so a text of up to n_positions + 1 tokens is one window. A longer one is scored in
windows that each feed n_positions tokens: the first scores tokens 1 .. n_positions, each next one
the `stride` tokens after those already scored, with the n_positions tokens before its last one as
its input (so the last window reaches back for a whole context). Every token is scored once; with
stride = n_positions these are lm-evaluation-harness's rolling windows (docs/sampling.md). Each row
of logits becomes a log-probability by the function `generate` uses for its new tokens, so with the
exact kernels the two agree bit for bit.
"""

from __future__ import annotations

import numpy as np

from ..gpt2.forward import GPT2, forward
from ..loop.sampling import token_log_prob
from ..loop.sequence import check_finite


def score(gpt: GPT2, ids: np.ndarray, stride: int) -> np.ndarray:
    """float64 [len(ids) - 1]: log P(ids[i] | ids[:i]) for i = 1 .. len(ids) - 1 (ids: at least 2), in
    windows of n_positions tokens scoring `stride` new tokens each when the text is longer than
    n_positions + 1 tokens (see the module docstring)."""
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
