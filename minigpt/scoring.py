"""Scoring a given text: the log-probability the model gives each of its tokens, and so its
perplexity, the way Hugging Face's perplexity guide computes it.

A text longer than the context is scored in overlapping windows of n_positions tokens that begin
at 0, stride, 2 * stride, ...; each window scores only the tokens the windows before it did not,
so every token is scored once, with at least n_positions - stride tokens of context once the first
window is past (docs/sampling.md). Each row of logits becomes a log-probability by the function
`generate` uses for its new tokens, so with the exact kernels the two agree bit for bit.
"""

from __future__ import annotations

import numbers

import numpy as np

from .errors import InputError, shown
from .model import Model, check_ids, check_model
from .sampling import token_log_prob


def check_stride(stride, n_positions: int) -> int:
    """The stride between windows: default n_positions // 2; windows must overlap, so 1 .. n_positions - 1."""
    if n_positions < 2:
        raise InputError("a model whose context holds 1 token (n_positions) cannot score: a window must hold "
                         "a token and its context")
    if stride is None:
        return n_positions // 2
    if isinstance(stride, bool) or not isinstance(stride, numbers.Integral) or not 1 <= stride < n_positions:
        raise InputError(f"stride must be an integer in 1..{n_positions - 1} (n_positions - 1, so that windows "
                         f"overlap), got {shown(stride)}")
    return int(stride)


def score(model: Model, ids, stride: int | None = None) -> np.ndarray:
    """float64 [len(ids) - 1]: log P(ids[i] | ids[:i]) for i = 1 .. len(ids) - 1, in windows of
    n_positions tokens advancing by `stride` (default n_positions // 2) when the text is longer."""
    ids = check_ids(ids, check_model(model).config.vocab_size)  # [N]
    if ids.size < 2:
        raise InputError(f"scoring needs at least 2 tokens (the first is only context for the next), got {ids.size}")
    n_positions = model.config.n_positions
    stride = check_stride(stride, n_positions)
    logprobs = np.empty(ids.size - 1)
    begin, scored = 0, 1  # the window's first token; the first token not scored yet
    while scored < ids.size:
        end = min(begin + n_positions, ids.size)
        logits = model.forward(ids[begin:end])  # [end - begin, vocab]: row j predicts ids[begin + j + 1]
        for i in range(scored, end):
            logprobs[i - 1] = token_log_prob(logits[i - 1 - begin], ids[i])
        begin, scored = begin + stride, end
    return logprobs
