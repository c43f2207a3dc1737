"""The public functions scripts call: generate, stream, generate_batch, score, prove, inspect. Each checks
what it is given (minigpt.loading, minigpt.requests), then runs the loops that assume checked input (minigpt.loop.loops,
minigpt.engine.speculative, minigpt.engine.engine) and minigpt.api.scoring, an overflow named by its layer.
"""

from __future__ import annotations

from typing import Callable, Iterator

import numpy as np

from ..errors import ContextLengthError, InputError, check_bool, check_ids, check_int, shown
from ..loop.loops import cached_steps, naive_steps
from ..loop.sequence import GenerationResult, Request, Sequence, StreamedToken, check_finite
from ..exact import causal_proof
from ..loading.checks import check_stride
from ..loading.model import Model, check_model, overflow_named_by_layer, steps_overflow_named
from ..requests.request import DEFAULT_NEW_TOKENS, check_options, check_prompt, make_request, takes_options
from ..engine.drafters import check_speculation
from ..engine.speculative import DraftCounts, SpeculativeResult, speculative_steps
from ..engine.engine import MAX_BATCH_SIZE, Engine
from ..engine.job import EngineResult
from . import inspection, scoring


# ------------------------------------------------------------------------------ generation


def sequence_and_steps(model: Model, request: Request, use_cache: bool, speculate,
                       draft_tokens: int | None) -> tuple[Sequence, Iterator[None], DraftCounts | None]:
    """A checked request's sequence, its loop not yet started (naive, cached or speculative, its own
    keywords checked now), and, speculating, the counts of its drafts."""
    seq = Sequence(request)
    if speculate is not None:
        if not check_bool(use_cache, "use_cache"):
            raise InputError("speculative decoding checks drafts against the KV cache: it cannot run without it",
                             "use_cache")
        drafter, draft_tokens = check_speculation(model, speculate, draft_tokens, request.max_positions)
        counts = DraftCounts()
        steps = speculative_steps(model, seq, drafter, draft_tokens, counts)
        return seq, steps_overflow_named(model, steps, lambda: seq.ids), counts
    if draft_tokens is not None:  # an option without effect is a mistake, never silently ignored
        raise InputError("{draft_tokens} ({value}) has no effect without {speculate} (the drafter)", "draft_tokens",
                         value=shown(draft_tokens))
    loop = cached_steps if check_bool(use_cache, "use_cache") else naive_steps
    return seq, steps_overflow_named(model, loop(model, seq), lambda: seq.ids), None


def checked_request(model: Model, prompt_ids, max_new_tokens, options: dict) -> Request:
    """The Request of a call of generate or stream (takes_options gives it every option), checked
    once: the options, then they and the prompt against the model (truncate_prompt offered)."""
    check_model(model)
    return make_request(model, prompt_ids, check_options({**options, "max_new_tokens": max_new_tokens}),
                        truncation_offered=True)


@takes_options(batched=False)
def generate(model: Model, prompt_ids, max_new_tokens: int = DEFAULT_NEW_TOKENS, *, use_cache: bool = True,
             speculate=None, draft_tokens: int | None = None, on_step: Callable[[int, float], None] | None = None,
             **options) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `prompt_ids` and time each one.

    The options are minigpt.requests.request.OPTIONS, each a keyword (docs/api.md). `speculate`
    ("ngram", a draft Model or a Drafter) verifies up to `draft_tokens` guessed tokens per step
    (minigpt.engine.speculative). on_step(tokens so far, that token's seconds) is called after each
    token; its own time is not counted in the next token's.
    """
    if on_step is not None and not callable(on_step):
        raise InputError("{on_step} must be a function or None, got {value}", "on_step", value=type(on_step).__name__)
    return generate_request(model, checked_request(model, prompt_ids, max_new_tokens, options), use_cache=use_cache,
                            speculate=speculate, draft_tokens=draft_tokens, on_step=on_step)


def generate_request(model: Model, request: Request, *, use_cache: bool = True, speculate=None,
                     draft_tokens: int | None = None,
                     on_step: Callable[[int, float], None] | None = None) -> GenerationResult:
    """`generate` for a Request make_request has made."""
    seq, loop, counts = sequence_and_steps(model, request, use_cache, speculate, draft_tokens)
    reported = 0
    for _ in loop:
        if on_step is not None:
            for i in range(reported, len(seq.tokens)):
                on_step(i + 1, seq.seconds[i])
            reported = len(seq.tokens)
    result = seq.result(bool(use_cache))  # checked in sequence_and_steps: True or False, maybe NumPy's
    return result if counts is None else SpeculativeResult(**vars(result), **vars(counts))


@takes_options(batched=False)
def stream(model: Model, prompt_ids, max_new_tokens: int = DEFAULT_NEW_TOKENS, *, use_cache: bool = True,
           speculate=None, draft_tokens: int | None = None, **options) -> Iterator[StreamedToken]:
    """Yield the new tokens as they are produced, with `generate`'s keywords (without on_step),
    checked at the call. A token is held back while its text could still begin a stop string, so
    the streamed texts concatenate to generate's `text` (docs/sampling.md)."""
    return stream_request(model, checked_request(model, prompt_ids, max_new_tokens, options), use_cache=use_cache,
                          speculate=speculate, draft_tokens=draft_tokens)


def stream_request(model: Model, request: Request, *, use_cache: bool = True, speculate=None,
                   draft_tokens: int | None = None) -> Iterator[StreamedToken]:
    """`stream` for a Request make_request has made, checked at the call."""
    seq, loop, _ = sequence_and_steps(model, request, use_cache, speculate, draft_tokens)

    def tokens() -> Iterator[StreamedToken]:
        released = 0
        for _ in loop:
            records = seq.streamed(released)
            released += len(records)
            yield from records

    return tokens()


# ---------------------------------------------------------------------------- many prompts


@takes_options(batched=True)
def generate_batch(model: Model, prompts, max_new_tokens=DEFAULT_NEW_TOKENS, *, max_batch_size: int = MAX_BATCH_SIZE,
                   kv_cache_tokens: int | None = None, prefix_cache: bool = True, **options) -> list[EngineResult]:
    """Generate for every prompt (a list of token-id lists) on a one-shot Engine, up to
    `max_batch_size` together; the results in prompt order (docs/batching.md).

    Each option is one value for all prompts or a list with one per prompt. With the exact kernels,
    result i equals generate(model, prompts[i], ...) with prompt i's options.
    """
    n_prompts = len(prompts) if hasattr(prompts, "__len__") else 1
    at_once = min(check_int(max_batch_size, "max_batch_size", 1), max(1, n_prompts))  # all the batch can hold
    engine = Engine(model, max_batch_size=at_once, kv_cache_tokens=kv_cache_tokens, prefix_cache=prefix_cache)
    return engine.generate(prompts, max_new_tokens, **options)


# ------------------------------------------------------------------------------- scoring


def score(model: Model, ids, stride: int | None = None) -> np.ndarray:
    """float64 [len(ids) - 1]: log P(ids[i] | ids[:i]), in windows advancing by `stride` (default
    n_positions // 2) when the text is longer than a context (minigpt.api.scoring)."""
    ids = check_ids(ids, check_model(model).config.vocab_size)  # [N]
    if ids.size < 2:
        raise InputError(f"scoring needs at least 2 tokens (the first is only context for the next), got {ids.size}")
    stride = check_stride(stride, model.config.n_positions)
    with overflow_named_by_layer(model, ids[:model.config.n_positions]):
        return scoring.score(model, ids, stride)


# ------------------------------------------------------------------------- proof, inspection


def prove(model: Model, prompt_ids, n_steps: int = 8) -> causal_proof.Proof:
    """causal_proof.prove on a checked prompt: every check of the argument that the cache is exact,
    run with the model's kernels, and the fast kernels' drift for contrast."""
    n_steps = check_int(n_steps, "n_steps", 2)  # the proof compares consecutive steps; n_steps new tokens
    prompt = check_prompt(check_model(model), prompt_ids, n_steps)
    with overflow_named_by_layer(model, prompt):
        return causal_proof.prove(model, prompt, n_steps)


INSPECT_TOKENS = 1024  # the most token ids `inspect` (the command) and /inspect look inside (docs/serving.md)


def inspect(model: Model, ids, layers=None, heads=None) -> inspection.Inspection:
    """inspection.inspect on 1 to n_positions checked token ids: the attention of `heads` of
    `layers` (None: every one; [] keeps none), the hidden states and the logit lens."""
    ids = check_ids(ids, check_model(model).config.vocab_size).tolist()
    if not 1 <= len(ids) <= model.config.n_positions:
        raise ContextLengthError(f"inspect takes 1 to {model.config.n_positions} token ids (n_positions), got {len(ids)}")
    layers, heads = (None if chosen is None else check_indices(chosen, name, limit) for chosen, name, limit in
                     ((layers, "layers", model.config.n_layer), (heads, "heads", model.config.n_head)))
    with overflow_named_by_layer(model, ids):
        found = inspection.inspect(model, ids, layers, heads)
        check_finite(found.logits)
        return found


def check_indices(values, name: str, limit: int) -> list[int]:
    """A list of distinct integers in 0 .. limit - 1 (layers, heads), or InputError about `name`."""
    if not isinstance(values, (list, tuple)):
        raise InputError(f"{{{name}}} must be a list of integers in 0..{limit - 1}, got {{value}}", name,
                         value=shown(values))
    checked = [check_int(v, name, 0, limit - 1) for v in values]
    if len(set(checked)) != len(checked):
        raise InputError(f"{{{name}}} names one twice: {{value}}", name, value=shown(values))
    return checked


def head_attention(model: Model, ids, layer: int, head: int) -> np.ndarray:
    """float32 [T, T]: inspect(model, ids).attention[layer, head], computed at the cost of that one
    head, for 1 to INSPECT_TOKENS token ids: what the server's /inspect answers."""
    ids = check_ids(ids, check_model(model).config.vocab_size).tolist()
    most = min(model.config.n_positions, INSPECT_TOKENS)
    if not 1 <= len(ids) <= most:
        raise ContextLengthError(f"the attention of 1 to {most} token ids can be looked at, got {len(ids)}")
    layer = check_int(layer, "layer", 0, model.config.n_layer - 1)
    head = check_int(head, "head", 0, model.config.n_head - 1)
    with overflow_named_by_layer(model, ids):
        weights = inspection.attention(model, ids, layer, head)
        check_finite(weights)
        return weights
