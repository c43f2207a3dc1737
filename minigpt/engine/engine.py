"""The Engine: a page pool and continuous-batching scheduler that last across calls, driven by one
thread at a time, which takes a batch of prompts and returns each one's result as if it ran alone
(docs/batching.md, docs/prefix-cache.md). generate_batch runs one; the server shares one
(minigpt.scripted.engine_thread).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

from ..errors import EngineBusyError, InputError, MinigptError, NumericalError, check_bool, check_int
from ..loading.model import Model, check_model, named_overflow, overflow
from ..loading.options import takes_options
from ..loading.requests import make_requests
from ..loop.sequence import GenerationResult, Request
from .paging import PAGE, PagePool, pages_for
from .scheduler import Job, Scheduler


MAX_BATCH_SIZE = 16  # sequences decoded together, by default


def pool_positions(n_positions: int, max_batch_size: int, kv_cache_tokens: int | None) -> int:
    """The positions a pool holds: kv_cache_tokens, at most (and by default) a whole context per
    place in the batch, all the batch can hold at once."""
    most = max_batch_size * n_positions
    return most if kv_cache_tokens is None else min(kv_cache_tokens, most)


class Engine(Scheduler):
    """A page pool and continuous-batching scheduler that last across calls, with a prefix cache:
    full pages of keys and values are kept and reused by later requests that begin with the same
    tokens (minigpt.engine.scheduler). The pool holds kv_cache_tokens positions (default, and at most: a whole
    context per place in the batch); its memory is committed as pages are written."""

    def __init__(self, model: Model, *, max_batch_size: int = MAX_BATCH_SIZE, kv_cache_tokens: int | None = None,
                 prefix_cache: bool = True):
        check_model(model)
        max_batch_size = check_int(max_batch_size, "max_batch_size", 1)
        if kv_cache_tokens is not None:
            kv_cache_tokens = check_int(kv_cache_tokens, "kv_cache_tokens", 1)
        tokens = pool_positions(model.config.n_positions, max_batch_size, kv_cache_tokens)
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
            for job in named_overflow(self.gpt, self.run(on_step), lambda: []):
                if job in mine and job.error is not None:  # its weights overflowed, or its processing gave up
                    raise failure(self.gpt, job)
                if job in mine:
                    yield job.index, job.result()

    def check_fits(self, requests: list[Request]) -> None:
        """InputError about kv_cache_tokens, naming (err.prompt) the first request that could never fit in the pool."""
        for i, r in enumerate(requests):
            if pages_for(r.max_positions) > self.pool.n_pages:
                raise InputError(f"{len(r.prompt)} prompt tokens + {r.max_new_tokens} new tokens need "
                                 f"{pages_for(r.max_positions) * PAGE} cache positions (whole pages of {PAGE}); "
                                 f"the pool holds {self.pool.n_pages * PAGE} ({{kv_cache_tokens}})",
                                 "kv_cache_tokens", prompt=i)


def failure(gpt, job: Job) -> MinigptError:
    """The error of a job that could not go on, about its prompt (err.prompt): an overflow names the
    layer where it began, traced over the job's ids; a processing that gave up says why."""
    error = overflow(gpt, job.error, job.seq.ids) if isinstance(job.error, NumericalError) else job.error
    error.prompt = job.index
    return error
