"""Autoregressive generation, the two ways the lesson compares.

- The naive loop (`use_cache=False`): every step runs the forward over the whole sequence so far
  and keeps only the last row of logits. Step n pushes P + n tokens through the model.
- The KV-cache loop (`use_cache=True`): the prompt is pushed through once (prefill), then each
  step feeds only the newest token and attends to the cached keys and values.

Both call the same `Model.forward`; only the lifetime of the cache differs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from .errors import ContextLengthError, InputError, check_int
from .kv_cache import KVCache
from .model import Model, Trace, check_ids
from .sampling import SamplingOptions, next_token


@dataclass(frozen=True, eq=False)
class Step:
    """One generated token with what produced it: its logits row [vocab], the cache that the
    forward wrote (a throwaway one in the naive loop) and, when recording, the forward's trace."""

    token: int
    logits: np.ndarray
    cache: KVCache
    trace: Trace | None


@dataclass(frozen=True)
class GenerationResult:
    prompt_ids: list[int]  # as fed to the model (an empty prompt becomes [<|endoftext|>])
    tokens: list[int]  # the new token ids
    step_seconds: list[float]  # wall time of each new token (the first includes the prefill)
    use_cache: bool


def prepare_prompt(model: Model, prompt_ids, max_new_tokens: int, truncate_prompt: bool = False) -> list[int]:
    """Validate a request before any work: ids, lengths, and that it fits in n_positions.

    An empty prompt starts from <|endoftext|>, as GPT-2's unconditional samples do. With
    `truncate_prompt`, a prompt too long to leave room for the new tokens keeps its last tokens.
    """
    max_new_tokens = check_int(max_new_tokens, "max_new_tokens", 0)
    config = model.config
    ids = check_ids(prompt_ids, config.vocab_size).tolist()
    if not ids:
        if config.eos_token_id is None:
            raise InputError("the prompt is empty and this model's vocabulary has no <|endoftext|> to start from")
        ids = [config.eos_token_id]
    room = config.n_positions - max_new_tokens
    if len(ids) > room:
        if not truncate_prompt or room < 1:
            raise ContextLengthError(
                f"prompt of {len(ids)} tokens + {max_new_tokens} new tokens exceeds the context of "
                f"{config.n_positions} (n_positions); shorten them"
                + (" or keep only the prompt's last tokens (truncate_prompt=True; generate --truncate-prompt)"
                   if room >= 1 else "")
            )
        ids = ids[-room:]
    return ids


def steps(model: Model, prompt: list[int], max_new_tokens: int, *, use_cache: bool = True,
          options: SamplingOptions = SamplingOptions(), stop_at_eos: bool = True,
          record: bool = False) -> Iterator[Step]:
    """The generation loop over an already validated prompt (see `prepare_prompt`)."""
    rng = np.random.default_rng(options.seed)
    seq = list(prompt)
    cache = model.new_cache(len(seq) + max_new_tokens) if use_cache else None
    for _ in range(max_new_tokens):
        if use_cache:
            step_cache, new = cache, seq[cache.length:]  # prefill once, then one token per step
        else:
            step_cache, new = model.new_cache(len(seq)), seq  # the naive loop: everything, every step
        trace = Trace() if record else None
        logits = model.forward(new, step_cache, last_only=True, trace=trace)[0]  # [vocab]
        token = next_token(logits, options, rng)
        yield Step(token, logits, step_cache, trace)
        if stop_at_eos and token == model.config.eos_token_id:
            return
        seq.append(token)


def start(model: Model, prompt_ids, max_new_tokens: int = 40, *, use_cache: bool = True,
          temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
          seed: int | None = None, stop_at_eos: bool = True,
          truncate_prompt: bool = False) -> tuple[list[int], Iterator[Step]]:
    """Check a request now, before any work; return the prompt as fed and the loop, not yet started."""
    options = SamplingOptions(temperature, top_k, top_p, seed)
    prompt = prepare_prompt(model, prompt_ids, max_new_tokens, truncate_prompt)
    return prompt, steps(model, prompt, max_new_tokens, use_cache=use_cache, options=options,
                         stop_at_eos=stop_at_eos)


def stream(model: Model, prompt_ids, max_new_tokens: int = 40, **options) -> Iterator[int]:
    """Yield new token ids one at a time. Takes `generate`'s options; they are checked at the call."""
    _, loop = start(model, prompt_ids, max_new_tokens, **options)
    return (step.token for step in loop)


def generate(model: Model, prompt_ids, max_new_tokens: int = 40, *,
             on_step: Callable[[int, float], None] | None = None, **options) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens and time each one.

    options: use_cache=True, temperature=0.0 (greedy), top_k=None, top_p=None, seed=None,
    stop_at_eos=True, truncate_prompt=False. on_step(tokens so far, this token's seconds) is
    called after each token (a progress bar); its own time is not counted in the next token's.
    """
    prompt, loop = start(model, prompt_ids, max_new_tokens, **options)
    tokens, seconds = [], []
    clock = time.perf_counter()
    for step in loop:
        tokens.append(step.token)
        seconds.append(time.perf_counter() - clock)
        if on_step is not None:
            on_step(len(tokens), seconds[-1])
        clock = time.perf_counter()
    return GenerationResult(prompt, tokens, seconds, options.get("use_cache", True))
