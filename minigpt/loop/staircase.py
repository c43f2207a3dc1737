"""The cost staircase, measured: the wall time of every generated token, naive loop vs KV cache.

Both loops run greedy on the same prompt for exactly N steps: without the cache step n reruns all
P + n positions and its time climbs; with it every step after the prefill does the same work
(docs/staircase.md compares it with minigpt.loop.cost's prediction).

Source: Inference Engineering (fanout.sh, inference-eng), "The Autoregressive Loop & Cost": the cost staircase.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .cost import Cost, estimate, gpt2_architecture
from .loops import cached_steps, naive_steps
from ..gpt2.forward import GPT2
from .sampling import SamplingOptions
from .sequence import Request, Sequence

OnStep = Callable[[str, int, float], None]  # (mode, tokens so far, that token's seconds)
MODES = ("naive", "cached")


@dataclass(frozen=True)
class Staircase:
    """Per-token seconds of both loops (token 1 includes the prompt's forward) and the arithmetic."""

    seconds: dict[str, list[float]]  # mode ("naive" or "cached") -> N wall times
    predicted: Cost  # for this model's shapes, P and N

    def summary(self, mode: str) -> dict[str, float]:
        """first, last and median per-token milliseconds, and the total in seconds."""
        s = self.seconds[mode]
        return {"first_ms": s[0] * 1e3, "last_ms": s[-1] * 1e3, "median_ms": statistics.median(s) * 1e3,
                "total_s": sum(s)}

    @property
    def measured_ratio(self) -> float:
        return sum(self.seconds["naive"]) / sum(self.seconds["cached"])


def fixed_prompt(gpt: GPT2, n_tokens: int) -> list[int]:
    """n_tokens arbitrary but reproducible token ids (the cost does not depend on which)."""
    return np.random.default_rng(0).integers(gpt.config.vocab_size, size=n_tokens).tolist()


def measure(gpt: GPT2, prompt_tokens: int, new_tokens: int, on_step: OnStep | None = None) -> Staircase:
    """Time both loops on the same prompt (sizes of at least 1 that fit the context: the command line
    checks them); a short warm-up first so that token 1 is not a cold start."""
    prompt = fixed_prompt(gpt, prompt_tokens)
    timed(gpt, prompt[:1], 1, "cached")  # the first BLAS calls, every weight's pages touched once
    seconds = {mode: timed(gpt, prompt, new_tokens, mode, on_step) for mode in MODES}
    predicted = estimate(gpt2_architecture("model", gpt.config), prompt_tokens, new_tokens)
    return Staircase(seconds, predicted)


def timed(gpt: GPT2, prompt: list[int], new_tokens: int, mode: str, on_step: OnStep | None = None) -> list[float]:
    """The seconds of each of new_tokens greedy steps of one loop, never stopping at <|endoftext|>."""
    seq = Sequence(Request(tuple(prompt), new_tokens, SamplingOptions(), eos_token_id=None))
    for _ in (cached_steps if mode == "cached" else naive_steps)(gpt, seq):
        if on_step is not None:
            on_step(mode, len(seq.tokens), seq.seconds[-1])
    return seq.seconds
