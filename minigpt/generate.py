"""Autoregressive generation, the two ways "The Autoregressive Loop & Cost" compares (source below).

- The naive loop (`use_cache=False`): every step runs the forward over the whole sequence so far
  and keeps only the last row of logits. Step n pushes P + n tokens through the model.
- The KV-cache loop (`use_cache=True`): the prompt is pushed through once (prefill), then each
  step feeds only the newest token and attends to the cached keys and values.

Both call the same `Model.forward`; only the lifetime of the cache differs. Speculative decoding
(`speculate=`, minigpt.speculative) is the cached loop checking several guessed tokens per step,
and `generate_batch` (minigpt.batching) runs many sequences' loops as one.

Source: Inference Engineering (fanout.sh, inference-eng), "The Autoregressive Loop & Cost".
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from .errors import InputError, check_bool
from .kv_cache import KVCache
from .model import Model, Trace
from .sequence import GenerationResult, Sequence, StreamedToken, make_request, new_sequence
from .speculative import check_speculation, speculative_steps


@dataclass(frozen=True, eq=False)
class Step:
    """One generated token with what produced it: its logits row [vocab], the cache that the
    forward wrote (a throwaway one in the naive loop) and, when recording, the forward's trace."""

    token: int
    logits: np.ndarray
    cache: KVCache
    trace: Trace | None


def steps(model: Model, seq: Sequence, *, use_cache: bool, record: bool = False) -> Iterator[Step]:
    """The loop over a checked request: one forward and one new token per step, until it ends."""
    cache = model.new_cache(seq.request.max_positions) if use_cache else None
    while not seq.done:
        clock = time.perf_counter()
        ids = seq.ids
        if use_cache:
            step_cache, new = cache, ids[cache.length:]  # prefill once, then one token per step
        else:
            step_cache, new = model.new_cache(len(ids)), ids  # the naive loop: everything, every step
        trace = Trace() if record else None
        logits = model.forward(new, step_cache, logits_to_keep=1, trace=trace)[0]  # [vocab]
        token = seq.choose(logits)
        seq.append(token, logits, time.perf_counter() - clock)
        yield Step(token, logits, step_cache, trace)


def sequence_and_steps(model: Model, prompt_ids, max_new_tokens: int, *, use_cache: bool, temperature: float,
                       top_k: int | None, top_p: float | None, seed: int | None, stop_at_eos: bool, stop,
                       top_logprobs: int, truncate_prompt: bool, speculate,
                       draft_tokens: int | None) -> tuple[Sequence, Iterator]:
    """Check a request now, before any work; return its sequence and its loop, not yet started: the
    cached or naive `steps`, or speculative ones. The loop yields after every model step; the
    sequence holds what the steps produced. No defaults here: they are `generate`'s, which `stream`
    repeats (a test keeps the two signatures equal)."""
    request = make_request(model, prompt_ids, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                           seed=seed, stop_at_eos=stop_at_eos, stop=stop, top_logprobs=top_logprobs,
                           truncate_prompt=truncate_prompt)
    seq = new_sequence(model, request)
    use_cache = check_bool(use_cache, "use_cache")
    if speculate is None:
        if draft_tokens is not None:  # an option without effect is a mistake, never silently ignored
            raise InputError(f"draft_tokens ({draft_tokens!r}) has no effect without speculate (the drafter)")
        return seq, steps(model, seq, use_cache=use_cache)
    if not use_cache:
        raise InputError("speculative decoding checks drafts against the KV cache: it cannot run without it")
    drafter, draft_tokens = check_speculation(model, speculate, draft_tokens, request.max_positions)
    return seq, speculative_steps(model, seq, drafter, draft_tokens)


def generate(model: Model, prompt_ids, max_new_tokens: int = 40, *, use_cache: bool = True,
             temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
             seed: int | None = None, stop_at_eos: bool = True, stop=None, top_logprobs: int = 0,
             truncate_prompt: bool = False, speculate=None, draft_tokens: int | None = None,
             on_step: Callable[[int, float], None] | None = None) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `prompt_ids` and time each one.

    temperature 0 is greedy; otherwise top_k, top_p and a seed shape and fix the sampling
    (minigpt.sampling). The sequence ends at <|endoftext|> (unless stop_at_eos=False), after
    max_new_tokens, or before the first of the `stop` strings in its new text. top_logprobs=N also
    records the N most likely tokens at each step (N at most 20). `speculate` ("ngram", a draft
    Model or a Drafter) checks up to `draft_tokens` (default 4) guessed tokens per step
    (minigpt.speculative): greedy with the exact kernels, the tokens are plain greedy decoding's
    (the fast kernels' ULPs may break a near-tie otherwise); sampling, they follow the same
    distribution, though a seed gives other tokens.
    on_step(tokens so far, that token's seconds) is called after each token (a progress bar); its
    own time is not counted in the next token's.
    """
    if on_step is not None and not callable(on_step):
        raise InputError(f"on_step must be a function or None, got {type(on_step).__name__}")
    seq, loop = sequence_and_steps(
        model, prompt_ids, max_new_tokens, use_cache=use_cache, temperature=temperature, top_k=top_k, top_p=top_p,
        seed=seed, stop_at_eos=stop_at_eos, stop=stop, top_logprobs=top_logprobs, truncate_prompt=truncate_prompt,
        speculate=speculate, draft_tokens=draft_tokens)
    reported = 0
    for _ in loop:
        if on_step is not None:
            for i in range(reported, len(seq.tokens)):
                on_step(i + 1, seq.seconds[i])
            reported = len(seq.tokens)
    return seq.result(bool(use_cache))  # checked in sequence_and_steps: True or False, maybe NumPy's


def stream(model: Model, prompt_ids, max_new_tokens: int = 40, *, use_cache: bool = True,
           temperature: float = 0.0, top_k: int | None = None, top_p: float | None = None,
           seed: int | None = None, stop_at_eos: bool = True, stop=None, top_logprobs: int = 0,
           truncate_prompt: bool = False, speculate=None,
           draft_tokens: int | None = None) -> Iterator[StreamedToken]:
    """Yield the new tokens as they are produced, each with its log-probabilities: `generate`'s
    parameters (without on_step), checked at the call. With stop strings a token is held back until
    it is sure not to be part of one."""
    seq, loop = sequence_and_steps(
        model, prompt_ids, max_new_tokens, use_cache=use_cache, temperature=temperature, top_k=top_k, top_p=top_p,
        seed=seed, stop_at_eos=stop_at_eos, stop=stop, top_logprobs=top_logprobs, truncate_prompt=truncate_prompt,
        speculate=speculate, draft_tokens=draft_tokens)

    def tokens() -> Iterator[StreamedToken]:
        shown = 0
        for _ in loop:
            records = seq.streamed(shown)
            shown += len(records)
            yield from records

    return tokens()
