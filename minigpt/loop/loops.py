"""Autoregressive generation, the two loops "The Autoregressive Loop & Cost" compares (source below).

The naive loop runs gpt2.forward over the whole sequence at every step (step n pushes P + n
tokens); the KV-cache loop pushes the prompt once, then only the newest token. Both drive a
`Sequence`, which chooses each token and decides when to stop.

Source: Inference Engineering (fanout.sh, inference-eng), "The Autoregressive Loop & Cost".
"""

from __future__ import annotations

import time
from typing import Iterator

import numpy as np

from ..gpt2.forward import GPT2, forward
from ..cache.kv_cache import forward_cached, new_cache
from .sequence import Sequence


def naive_steps(gpt: GPT2, seq: Sequence) -> Iterator[np.ndarray]:
    """The loop without a cache: one forward over every position so far per new token. Yields each
    step's logits row [vocab], the one its token was chosen from."""
    while not seq.done:
        clock = time.perf_counter()
        logits = forward(gpt, seq.ids, logits_to_keep=1)[0]  # [vocab]: the whole sequence, every step
        seq.append(seq.choose(logits), logits, time.perf_counter() - clock)
        yield logits


def cached_steps(gpt: GPT2, seq: Sequence) -> Iterator[np.ndarray]:
    """The loop with a KV cache: the prompt once, then one new position per token. Yields as naive_steps."""
    cache = new_cache(gpt.config, seq.request.max_positions)  # allocated once for the whole request
    while not seq.done:
        clock = time.perf_counter()
        logits = forward_cached(gpt, seq.ids[cache.length:], cache, logits_to_keep=1)[0]  # [vocab]
        seq.append(seq.choose(logits), logits, time.perf_counter() - clock)
        yield logits
