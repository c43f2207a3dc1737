"""Choosing the next token from logits (greedy, temperature, top-k and top-p, as Hugging Face does),
and the log-probabilities of the model's raw distribution that scripts ask for."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingOptions:
    """temperature 0 is greedy (argmax); otherwise logits / temperature, then top_k, then top_p."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None


def filtered_log_probs(logits: np.ndarray, options: SamplingOptions) -> np.ndarray:
    """float64 log-probabilities [vocab] after temperature, top-k and top-p (removed: -inf).

    Sampling works in float64: it is not part of the forward, and probabilities near 1e-8 matter here.
    The maximum is subtracted before dividing, so a tiny temperature sends scores to -inf, never to NaN.
    """
    z = logits.astype(np.float64)
    with np.errstate(over="ignore"):  # overflow here is the intended -inf
        z = (z - z.max()) / options.temperature
    if options.top_k is not None and options.top_k < z.size:
        kth = np.partition(z, -options.top_k)[-options.top_k]
        z[z < kth] = -np.inf  # ties with the k-th value are kept, as in Hugging Face
    if options.top_p is not None and options.top_p < 1:
        order = np.argsort(-z, kind="stable")
        p = np.exp(z[order] - z[order[0]])
        p /= p.sum()
        mass_before = np.cumsum(p) - p
        z[order[mass_before >= options.top_p]] = -np.inf  # keep the smallest top set holding top_p
    z -= z.max()
    return z - np.log(np.exp(z).sum())


def probabilities(logits: np.ndarray, options: SamplingOptions) -> np.ndarray:
    """float64 [vocab]: what sampling draws from, exp(filtered_log_probs) (summing to 1 up to rounding)."""
    return np.exp(filtered_log_probs(logits, options))


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """A token id drawn from probabilities p [vocab] that sum to 1."""
    return int(rng.choice(p.size, p=p))


def next_token(logits: np.ndarray, options: SamplingOptions, rng: np.random.Generator) -> int:
    """One token id from one row of logits [vocab]."""
    if options.temperature == 0:
        return int(np.argmax(logits))
    probs = probabilities(logits, options)
    return draw(probs / probs.sum(), rng)


def log_normalizer(logits: np.ndarray) -> float:
    """log(sum(exp(logits))) of one row of float32 logits [vocab], computed stably (the maximum
    taken out first, the exponentials summed in float64)."""
    top = logits.max()
    return float(top) + float(np.log(np.exp(logits - top).sum(dtype=np.float64)))


def token_log_prob(logits: np.ndarray, token: int) -> float:
    """log P(token) under one row of float32 logits [vocab]: log_softmax(logits)[token], bit for bit,
    without building the whole row. `generate` reports it for each new token, `score` for each text token."""
    return float(logits[token]) - log_normalizer(logits)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """float64 log-probabilities [vocab] of the model's raw distribution (no temperature, top-k or
    top-p): what `top_logprobs` ranks. Entry t is bitwise `token_log_prob(logits, t)`, the function
    `generate` and `score` use for one token."""
    return logits.astype(np.float64) - log_normalizer(logits)


MAX_TOP_LOGPROBS = 20  # as the OpenAI API and vLLM allow: more would only grow every step's output


def top_log_probs(log_probs: np.ndarray, n: int) -> list[tuple[int, float]]:
    """The n most likely token ids with their log-probabilities, most likely first (ties: lower id first)."""
    if n <= 0:
        return []
    n = min(n, log_probs.size)
    kth = -np.partition(-log_probs, n - 1)[n - 1]  # the n-th largest value
    above, equal = np.flatnonzero(log_probs > kth), np.flatnonzero(log_probs == kth)
    chosen = np.concatenate([above, equal[:n - above.size]])  # flatnonzero is ascending: lower ids win ties
    order = chosen[np.lexsort((chosen, -log_probs[chosen]))]
    return [(int(i), float(log_probs[i])) for i in order]
