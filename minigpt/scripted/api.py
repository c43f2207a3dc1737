"""The public functions scripts call: generate, stream, generate_batch, Engine, score, prove. Each checks what it
is given (minigpt.loading.checks), then runs the loops that assume checked input (minigpt.loop.loops,
minigpt.engine.speculative, minigpt.engine.scheduler) and minigpt.scripted.scoring, an overflow named by its layer.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator, TypeVar

import numpy as np

from ..exact import causal_proof, inspection
from . import scoring
from ..loading.checks import check_ids, check_speculation, check_stride, prepare_prompt
from ..errors import (ContextLengthError, EngineBusyError, InputError, MinigptError, NumericalError, check_bool,
                      check_int, shown)
from ..loop.loops import cached_steps, naive_steps
from ..gpt2.forward import GPT2
from ..loading.model import Model, check_model, overflow
from ..engine.scheduler import Job, Scheduler
from ..engine.paging import PAGE, PagePool, pages_for
from ..loop.processing import Penalties, Processing
from ..loop.sampling import SamplingOptions
from ..loop.sequence import GenerationResult, Request, Sequence, StreamedToken, check_finite
from ..engine.speculative import speculative_steps
from .options import OPTIONS, check_options, takes_options
from .structured import compile_constraint, one_constraint

T = TypeVar("T")


# ------------------------------------------------------------------------------ generation


def make_request(model: Model, prompt_ids, max_new_tokens: int = 40, **options) -> Request:
    """Check everything about a request before any work: its options (OPTIONS' checks), then the
    options and the prompt against the model. Without a truncate_prompt keyword the caller offers no
    such option, and a prompt too long for the context is refused without pointing to it."""
    check_model(model)
    values = check_options({**options, "max_new_tokens": max_new_tokens})
    check_against_model(model, values)
    prompt = prepare_prompt(model, prompt_ids, values["max_new_tokens"],
                            values["truncate_prompt"] if "truncate_prompt" in options else None)
    eos = model.config.eos_token_id if values["stop_at_eos"] else None
    # the text, the stop strings and a constraint need the tokenizer: it is built now, before any work
    tokenizer = None if model.tokenizer_loader is None else model.tokenizer
    token_bytes = None if tokenizer is None else tokenizer.decode_single_token_bytes
    sampling = SamplingOptions(values["temperature"], values["top_k"], values["top_p"], values["seed"])
    return Request(tuple(prompt), int(values["max_new_tokens"]), sampling, eos, values["stop"], values["top_logprobs"],
                   token_bytes, values["min_tokens"], processing(values, tokenizer, eos))


def check_against_model(model: Model, values: dict) -> None:
    """Checked options against the model: stop strings need its tokenizer, logit_bias's ids its vocabulary."""
    if values["stop"] and getattr(model, "tokenizer_loader", None) is None:
        raise InputError(f"stop strings need the model's tokenizer, and this model's vocabulary "
                         f"({model.config.vocab_size} tokens) is not GPT-2's", "stop")
    outside = [token for token in values["logit_bias"] if token >= model.config.vocab_size]
    if outside:
        raise InputError("{logit_bias} has the token id {value}, outside the vocabulary [0, {vocab_size})",
                         "logit_bias", value=outside[0], vocab_size=model.config.vocab_size)


def processing(values: dict, tokenizer, eos: int | None) -> tuple[Processing, ...]:
    """The logits processing checked options ask for (minigpt.loop.processing), none when they change
    nothing: the penalties, then a constraint compiled for the tokenizer (last: a mask must win over
    the biases), which allows <|endoftext|> only if the sequence stops at it (eos)."""
    penalties = Penalties(tuple(values["logit_bias"]), tuple(values["logit_bias"].values()),
                          float(values["presence_penalty"]), float(values["frequency_penalty"]),
                          float(values["repetition_penalty"]))
    constraint = one_constraint(values)
    if constraint is not None:
        constraint = compile_constraint(tokenizer, *constraint, tokenizer is not None and eos == tokenizer.eot_token)
    return tuple(p for p in (None if penalties == Penalties() else penalties, constraint) if p is not None)


def sequence_and_steps(model: Model, prompt_ids, max_new_tokens: int, use_cache: bool, speculate,
                       draft_tokens: int | None, options: dict) -> tuple[Sequence, Iterator[None]]:
    """Check a request now, before any work; return its sequence and its loop, not yet started: the
    naive, cached or speculative steps, each yielding after a model step, with an overflow named
    by its layer."""
    request = make_request(model, prompt_ids, max_new_tokens, **options)
    seq = Sequence(request)
    if speculate is not None:
        if not check_bool(use_cache, "use_cache"):
            raise InputError("speculative decoding checks drafts against the KV cache: it cannot run without it",
                             "use_cache")
        drafter, draft_tokens = check_speculation(model, speculate, draft_tokens, request.max_positions)
        return seq, checked_steps(model, seq, speculative_steps(model, seq, drafter, draft_tokens))
    if draft_tokens is not None:  # an option without effect is a mistake, never silently ignored
        raise InputError("{draft_tokens} ({value}) has no effect without {speculate} (the drafter)", "draft_tokens",
                         value=shown(draft_tokens))
    loop = cached_steps if check_bool(use_cache, "use_cache") else naive_steps
    return seq, checked_steps(model, seq, loop(model, seq))


def named_overflow(gpt: GPT2, items: Iterator[T], ids: Callable[[], list[int]]) -> Iterator[T]:
    """The items of a loop, each computed with overflow warnings off: an overflow is the NumericalError
    of a finiteness check, raised here naming the layer where it began in a forward over ids() (or,
    from an engine, over its sequence's)."""
    while True:
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                item = next(items)
        except StopIteration:
            return
        except NumericalError as e:
            raise overflow(gpt, e, ids()) from None
        yield item


def checked_steps(gpt: GPT2, seq: Sequence, loop: Iterator) -> Iterator:
    """A sequence's loop, its overflows named by the layer where they began."""
    return named_overflow(gpt, loop, lambda: seq.ids)


@takes_options(batched=False)
def generate(model: Model, prompt_ids, max_new_tokens: int = 40, *, use_cache: bool = True, speculate=None,
             draft_tokens: int | None = None, on_step: Callable[[int, float], None] | None = None,
             **options) -> GenerationResult:
    """Generate up to `max_new_tokens` tokens after `prompt_ids` and time each one.

    The request's options are minigpt.scripted.options.OPTIONS, each a keyword (docs/api.md):
    temperature 0 is greedy; otherwise top_k, top_p and a seed shape and fix the sampling
    (minigpt.loop.sampling); logit_bias and the penalties process the logits first
    (minigpt.loop.processing). The sequence ends at <|endoftext|> (unless stop_at_eos=False), after
    max_new_tokens, or at the token completing the first of the `stop` strings in its new text (its
    `text` ends before the string; docs/sampling.md), neither within its first min_tokens tokens.
    top_logprobs=N also records the N most likely tokens at each step (N at most 20).
    `speculate` ("ngram", a draft Model or a Drafter) checks up to `draft_tokens` (default 4)
    guessed tokens per step (minigpt.engine.speculative): greedy with the exact kernels, the tokens
    are plain greedy decoding's (the fast kernels' ULPs may break a near-tie otherwise); sampling,
    they follow the same distribution, though a seed gives other tokens. on_step(tokens so far,
    that token's seconds) is called after each token (a progress bar); its own time is not counted
    in the next token's.
    """
    if on_step is not None and not callable(on_step):
        raise InputError("{on_step} must be a function or None, got {value}", "on_step", value=type(on_step).__name__)
    seq, loop = sequence_and_steps(model, prompt_ids, max_new_tokens, use_cache, speculate, draft_tokens, options)
    reported = 0
    for _ in loop:
        if on_step is not None:
            for i in range(reported, len(seq.tokens)):
                on_step(i + 1, seq.seconds[i])
            reported = len(seq.tokens)
    return seq.result(bool(use_cache))  # checked in sequence_and_steps: True or False, maybe NumPy's


@takes_options(batched=False)
def stream(model: Model, prompt_ids, max_new_tokens: int = 40, *, use_cache: bool = True, speculate=None,
           draft_tokens: int | None = None, **options) -> Iterator[StreamedToken]:
    """Yield the new tokens as they are produced, each with its log-probabilities and the text it adds:
    `generate`'s keywords (without on_step), checked at the call. A token is held back while its
    text could still begin a stop string, so that the streamed texts concatenate to generate's `text`
    and nothing streamed is taken back (docs/sampling.md)."""
    seq, loop = sequence_and_steps(model, prompt_ids, max_new_tokens, use_cache, speculate, draft_tokens, options)

    def tokens() -> Iterator[StreamedToken]:
        shown = 0
        for _ in loop:
            records = seq.streamed(shown)
            shown += len(records)
            yield from records

    return tokens()


# ---------------------------------------------------------------------------- many prompts


def make_requests(model: Model, prompts, options: dict) -> list[Request]:
    """One checked Request per prompt. Each option is one value for all prompts or a list with one
    value per prompt (Option.per_prompt). A bad request is named by its index, before any work."""
    check_model(model)
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__"):
        raise InputError("{prompts} must be a list of token-id lists", "prompts")
    per_prompt = {}
    for name, value in options.items():
        listed = OPTIONS[name].per_prompt(value)
        if listed and len(value) != len(prompts):
            raise InputError(f"{{{name}}} has {len(value)} values for {len(prompts)} prompts", name)
        per_prompt[name] = value if listed else [value] * len(prompts)
    requests = []
    for i, prompt in enumerate(prompts):
        try:
            requests.append(make_request(model, prompt, **{name: values[i] for name, values in per_prompt.items()}))
        except MinigptError as e:
            e.prompt = i
            raise
    return requests


class Engine(Scheduler):
    """A page pool and continuous-batching scheduler that last across calls, with a prefix cache:
    full pages of keys and values are kept and reused by later requests that begin with the same
    tokens (minigpt.engine.scheduler). The pool holds kv_cache_tokens positions (default, and at most: a whole
    context per place in the batch); its memory is committed as pages are written."""

    def __init__(self, model: Model, *, max_batch_size: int = 16, kv_cache_tokens: int | None = None,
                 prefix_cache: bool = True):
        check_model(model)
        max_batch_size = check_int(max_batch_size, "max_batch_size", 1)
        most = max_batch_size * model.config.n_positions  # all the batch can hold at once
        tokens = most if kv_cache_tokens is None else min(check_int(kv_cache_tokens, "kv_cache_tokens", 1), most)
        try:
            pool = PagePool(model.config, pages_for(tokens))
        except (MemoryError, OSError, OverflowError, ValueError) as e:
            raise InputError(f"cannot reserve memory for keys and values of {tokens} positions ({{error}}): lower "
                             "{kv_cache_tokens} or {max_batch_size}", "kv_cache_tokens", error=e) from None
        super().__init__(model, pool, max_batch_size, check_bool(prefix_cache, "prefix_cache"))
        self._lock = threading.Lock()  # guards the two fields below
        self._driver: int | None = None  # the thread in a step, or in a run or results it started
        self._outside = False  # that thread runs the caller's code: an on_step, or the loop over results

    @contextlib.contextmanager
    def _driving(self, within_run: bool = False) -> Iterator[None]:
        """Hold the engine for this thread: EngineBusyError if another thread holds it, or if this
        one is inside a call of its own (within_run: a run's own steps, which may)."""
        me = threading.get_ident()
        with self._lock:
            mine = within_run and self._driver == me and not self._outside
            if not mine and self._driver is not None:
                where = "inside its own run (an on_step, or a loop over its results)" if self._driver == me \
                    else "by another thread"
                raise EngineBusyError(f"this Engine is being driven {where}: one engine is driven from one "
                                      "thread at a time, one call after another (use one Engine per thread)")
            self._driver = me
        try:
            yield
        finally:
            if not mine:
                with self._lock:
                    self._driver = None

    @contextlib.contextmanager
    def _outside_call(self) -> Iterator[None]:
        """The caller's code runs now: a step from it would be nested."""
        self._outside = True
        try:
            yield
        finally:
            self._outside = False

    def submit(self, request: Request, index: int = 0, prompt_logprobs: bool = False) -> Job:
        """Scheduler.submit (from any thread), after refusing a request that could never fit in the pool:
        queued, it would wait for pages forever."""
        self.check_fits([request])
        return super().submit(request, index, prompt_logprobs)

    def step(self) -> tuple[list[Job], int]:
        """Scheduler.step, by one thread at a time."""
        with self._driving(within_run=True):
            return super().step()

    def run(self, on_step: Callable[[int], None] | None = None) -> Iterator[Job]:
        """Scheduler.run, holding the engine for this thread until it ends."""
        with self._driving(within_run=True):
            def called(tokens: int) -> None:
                with self._outside_call():
                    on_step(tokens)
            for job in super().run(None if on_step is None else called):
                with self._outside_call():
                    yield job

    @takes_options(batched=True)
    def generate(self, prompts, max_new_tokens=40, *, prompt_logprobs=False, **options) -> list[GenerationResult]:
        """generate_batch's options (each one value or one per prompt) and prompt_logprobs: results in
        prompt order, each as if generated alone. With prompt_logprobs, result.prompt_logprobs is
        [None, log P(ids[1] | ids[:1]), ...] (bitwise minigpt.score's with the exact kernels) and,
        with top_logprobs=N, result.prompt_top_logprobs the N most likely at each position.
        max_new_tokens=0 scores only."""
        requests = make_requests(self.gpt, prompts, {**options, "max_new_tokens": max_new_tokens})
        scoring = prompt_logprobs if isinstance(prompt_logprobs, (list, tuple)) else [prompt_logprobs] * len(requests)
        if len(scoring) != len(requests):
            raise InputError(f"{{prompt_logprobs}} has {len(scoring)} values for {len(requests)} prompts",
                             "prompt_logprobs")
        results: list[GenerationResult | None] = [None] * len(requests)
        for i, result in self.results(requests, [check_bool(p, "prompt_logprobs") for p in scoring]):
            results[i] = result
        return results

    def results(self, requests: list[Request], prompt_logprobs: list[bool],
                on_step: Callable[[int], None] | None = None) -> Iterator[tuple[int, GenerationResult]]:
        """Run checked requests to the end: (index, result) as each of them finishes; on_step(new
        tokens) after every step. Requests submitted otherwise run alongside, to their end, but are
        not among the results. A request that could never fit in the pool is refused before any work; one
        whose processing gives up mid-way (a grammar beyond llguidance's limits) raises its error then."""
        with self._driving():
            self.check_fits(requests)
            jobs = [self.submit(r, i, p) for i, (r, p) in enumerate(zip(requests, prompt_logprobs))]
            mine = set(jobs)
            try:
                for job in named_overflow(self.gpt, self.run(on_step), lambda: []):  # the error has its sequence
                    if job in mine and job.error is not None:  # its processing gave up mid-way: an error about it
                        job.error.prompt = job.index
                        raise job.error
                    if job in mine:
                        yield job.index, job.result()
            except NumericalError as e:
                if e.sequence not in mine:
                    raise
                raise NumericalError(f"prompt {e.sequence.index}: {e}", e.sequence) from None

    def check_fits(self, requests: list[Request]) -> None:
        """InputError about kv_cache_tokens, naming (err.prompt) the first request that could never fit in the pool."""
        for i, r in enumerate(requests):
            if pages_for(r.max_positions) > self.pool.n_pages:
                raise InputError(f"{len(r.prompt)} prompt tokens + {r.max_new_tokens} new tokens need "
                                 f"{pages_for(r.max_positions) * PAGE} cache positions (whole pages of {PAGE}); "
                                 f"the pool holds {self.pool.n_pages * PAGE} ({{kv_cache_tokens}})",
                                 "kv_cache_tokens", prompt=i)


@takes_options(batched=True)
def generate_batch(model: Model, prompts, max_new_tokens=40, *, max_batch_size: int = 16,
                   kv_cache_tokens: int | None = None, prefix_cache: bool = True, **options) -> list[GenerationResult]:
    """Generate for every prompt (a list of token-id lists), decoding up to `max_batch_size` of them
    together, on a one-shot Engine (prompts of one call share their prefixes). Returns the results
    in prompt order.

    Each request option (generate's but truncate_prompt) is one value for all prompts or a list
    with one per prompt. An int seed gives every prompt its own generator seeded with it, as if it
    were generated alone. A step's wall time counts for every token it produced. The keys and
    values of all sequences share a pool of kv_cache_tokens positions (default: max_batch_size whole
    contexts); sequences are preempted and recomputed when it runs short (minigpt.engine.scheduler). With the
    exact kernels, result i equals generate(model, prompts[i], ...) with prompt i's options.
    """
    n_prompts = len(prompts) if hasattr(prompts, "__len__") else 1
    at_once = min(check_int(max_batch_size, "max_batch_size", 1), max(1, n_prompts))  # all the batch can hold
    engine = Engine(model, max_batch_size=at_once, kv_cache_tokens=kv_cache_tokens, prefix_cache=prefix_cache)
    return engine.generate(prompts, max_new_tokens, **options)


# ------------------------------------------------------------------------------- scoring


def score(model: Model, ids, stride: int | None = None) -> np.ndarray:
    """float64 [len(ids) - 1]: log P(ids[i] | ids[:i]) for i = 1 .. len(ids) - 1, in windows of
    n_positions tokens advancing by `stride` (default n_positions // 2) when the text is longer
    (minigpt.scripted.scoring)."""
    ids = check_ids(ids, check_model(model).config.vocab_size)  # [N]
    if ids.size < 2:
        raise InputError(f"scoring needs at least 2 tokens (the first is only context for the next), got {ids.size}")
    stride = check_stride(stride, model.config.n_positions)
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            return scoring.score(model, ids, stride)
    except NumericalError as e:
        raise overflow(model, e, ids[:model.config.n_positions]) from None


# ------------------------------------------------------------------------- proof, inspection


def prove(model: Model, prompt_ids, n_steps: int = 8) -> causal_proof.Proof:
    """causal_proof.prove on a checked prompt: every check of the argument that the cache is exact,
    run with the model's kernels, and the fast kernels' drift for contrast."""
    n_steps = check_int(n_steps, "n_steps", 2)  # the proof compares consecutive steps
    prompt = prepare_prompt(check_model(model), prompt_ids, n_steps)
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            return causal_proof.prove(model, prompt, n_steps)
    except NumericalError as e:
        raise overflow(model, e, prompt) from None


def inspect(model: Model, ids) -> inspection.Inspection:
    """inspection.inspect on checked token ids (1 to n_positions of them): one forward kept for a
    reader, its attention per layer and head, its hidden states and the logit lens."""
    ids = check_ids(ids, check_model(model).config.vocab_size).tolist()
    if not 1 <= len(ids) <= model.config.n_positions:
        raise ContextLengthError(f"inspect takes 1 to {model.config.n_positions} token ids (n_positions), got {len(ids)}")
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            found = inspection.inspect(model, ids)
            check_finite(found.logits)
            return found
    except NumericalError as e:
        raise overflow(model, e, ids) from None
