"""The Engine: a page pool and a scheduler that last across calls, driven by one thread at a time;
each prompt's result is as if it ran alone (docs/batching.md). A step is nano-vllm's
LLMEngine.step: schedule (the jobs whose grammar mask is late sitting out), run the model once over
the chosen jobs (minigpt.exact.batched), then record each job's token, prompt scores and newly full
pages.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

import numpy as np

from ..errors import EngineBusyError, InputError, MinigptError, NumericalError, check_bool, check_int
from ..exact.batched import forward_batch
from ..loading.model import Model, check_model, with_layer
from ..requests.request import DEFAULT_NEW_TOKENS, make_requests, takes_options
from ..loop.sampling import log_softmax, token_log_prob, top_log_probs
from ..loop.sequence import Request, Sequence, check_finite
from .paging import (PAGE, PagedCache, PagePool, PageScores, PrefixEntry, chained_hashes, page_hash, page_tokens,
                     pages_for)
from .job import EngineResult, Job, Status
from .masks import MaskThread
from .scheduler import Scheduler


MAX_BATCH_SIZE = 16  # sequences decoded together, by default


def pool_positions(n_positions: int, max_batch_size: int, kv_cache_tokens: int | None) -> int:
    """The positions a pool holds: kv_cache_tokens, at most (and by default) a whole context per
    place in the batch, all the batch can hold at once."""
    most = max_batch_size * n_positions
    return most if kv_cache_tokens is None else min(kv_cache_tokens, most)


class Engine:
    """A page pool (of pool_positions' size) and a scheduler that last across calls, with a prefix
    cache (docs/prefix-cache.md)."""

    def __init__(self, model: Model, *, max_batch_size: int = MAX_BATCH_SIZE, kv_cache_tokens: int | None = None,
                 prefix_cache: bool = True):
        self.gpt = check_model(model)
        self.max_batch_size = check_int(max_batch_size, "max_batch_size", 1)
        if kv_cache_tokens is not None:
            kv_cache_tokens = check_int(kv_cache_tokens, "kv_cache_tokens", 1)
        tokens = pool_positions(model.config.n_positions, self.max_batch_size, kv_cache_tokens)
        try:
            self.pool = PagePool(model.config, pages_for(tokens))
        except (MemoryError, OSError, OverflowError, ValueError) as e:
            raise InputError(f"cannot reserve memory for keys and values of {tokens} positions ({{error}}): lower "
                             "{kv_cache_tokens} or {max_batch_size}", "kv_cache_tokens", error=e) from None
        root = page_hash(f"{model.kernels.name} {id(model.params)}".encode(), ())  # the pool serves one model
        self.scheduler = Scheduler(self.pool, self.max_batch_size, check_bool(prefix_cache, "prefix_cache"), root)
        self.masks = MaskThread()
        self._lock = threading.Lock()  # guards the two fields below
        self._driver: int | None = None  # the thread in a step, or in a run or results it started
        self._outside = False  # that thread runs the caller's code: an on_tokens, or the loop over results

    @contextlib.contextmanager
    def _driving(self, within_run: bool = False) -> Iterator[None]:
        """Hold the engine for this thread: EngineBusyError if another thread holds it, or if this
        one is inside a call of its own (within_run: a run's own steps, which may)."""
        me = threading.get_ident()
        with self._lock:
            mine = within_run and self._driver == me and not self._outside
            if not mine and self._driver is not None:
                where = "inside its own run (an on_tokens, or a loop over its results)" if self._driver == me \
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

    def jobs_for(self, requests: list[Request], prompt_logprobs: list[bool] | None = None) -> list[Job]:
        """A job for each checked request (job i: request i, scoring its prompt if prompt_logprobs[i]),
        not yet queued. InputError about kv_cache_tokens, naming (err.prompt) the first request that
        could never fit in the pool: queued, it would wait for pages forever."""
        scoring = [False] * len(requests) if prompt_logprobs is None else prompt_logprobs
        if len(scoring) != len(requests):
            raise InputError(f"{{prompt_logprobs}} has {len(scoring)} values for {len(requests)} prompts",
                             "prompt_logprobs")
        for i, r in enumerate(requests):
            if pages_for(r.max_positions) > self.pool.n_pages:
                raise InputError(f"{len(r.prompt)} prompt tokens + {r.max_new_tokens} new tokens need "
                                 f"{pages_for(r.max_positions) * PAGE} cache positions (whole pages of {PAGE}); "
                                 f"the pool holds {self.pool.n_pages * PAGE} ({{kv_cache_tokens}})",
                                 "kv_cache_tokens", prompt=i)
        return [Job(i, Sequence(r), PagedCache(self.pool), p) for i, (r, p) in enumerate(zip(requests, scoring))]

    def submit(self, jobs: list[Job]) -> None:
        """Queue jobs (from any thread): they join the batch at coming steps."""
        for job in jobs:
            self.scheduler.add(job)

    def cancel(self, job: Job) -> None:
        """Stop a request: at the next step it leaves, its pages back in the pool."""
        job.status = Status.CANCELLED

    def stats(self) -> dict:
        pool, scheduler = self.pool, self.scheduler
        return {"pages_total": pool.n_pages, "pages_in_use": pool.in_use, "pages_cached": len(pool.cached),
                "pages_free": int(pool.free.sum()), "cached_token_hits": scheduler.cached_token_hits,
                "evictions": pool.evictions, "preemptions": scheduler.preemptions}

    def in_batch(self) -> list[Job]:
        """The jobs of the running batch, oldest first (a copy)."""
        return list(self.scheduler.running)

    def queued(self) -> list[Job]:
        """The jobs waiting for a place or for pages, next first (a copy)."""
        return list(self.scheduler.waiting)

    def pending(self) -> bool:
        """Jobs are submitted, waiting or running: a step has work (if only to let cancelled ones leave)."""
        return self.scheduler.pending()

    def step(self) -> tuple[list[Job], int]:
        """One step, by one thread at a time: schedule, run the model over the scheduled jobs (a
        prefill for the newly admitted, one token for the others), record what it computed.
        Returns the jobs that finished and the tokens made."""
        with self._driving(within_run=True):
            finished, running = self.scheduler.schedule()
            jobs = self.masks.ready(running)  # a job whose mask is not ready sits out
            if not jobs:
                return finished, 0
            clock = time.perf_counter()
            with np.errstate(over="ignore", invalid="ignore"):  # an overflow is its job's NumericalError
                logits = forward_batch(self.gpt, [job.seq.ids[job.cache.length:] for job in jobs],
                                       [job.cache for job in jobs], [0 if job.needs_prompt_scores else 1 for job in jobs])
            made = sum(self._record(job, rows, clock) for job, rows in zip(jobs, logits))  # rows [T or 1, vocab]
            return finished + self.scheduler.finish(jobs), made

    def run(self, on_tokens: Callable[[int], None] | None = None) -> Iterator[Job]:
        """Step until every submitted request has finished, yielding each as it finishes; on_tokens(n)
        after every step that made n tokens. However it ends (an error, Ctrl-C, the caller stopping early),
        every unfinished request is cancelled and its pages are back in the pool."""
        with self._driving(within_run=True):
            try:
                while self.scheduler.pending():
                    finished, made = self.step()
                    with self._outside_call():
                        if on_tokens is not None and made:
                            on_tokens(made)
                        yield from finished
            finally:
                for job in self.scheduler.jobs():
                    job.status = Status.CANCELLED
                self.step()

    @takes_options(batched=True)
    def generate(self, prompts, max_new_tokens=DEFAULT_NEW_TOKENS, *, prompt_logprobs=False,
                 **options) -> list[EngineResult]:
        """generate_batch with prompt_logprobs: result.prompt_logprobs is [None, log P(ids[1] | ids[:1]),
        ...], bitwise minigpt.score's with the exact kernels (docs/api.md). max_new_tokens=0 scores only."""
        requests = make_requests(self.gpt, prompts, {**options, "max_new_tokens": max_new_tokens})
        scoring = prompt_logprobs if isinstance(prompt_logprobs, (list, tuple)) else [prompt_logprobs] * len(requests)
        results: list[EngineResult | None] = [None] * len(requests)
        for i, result in self.results(self.jobs_for(requests, [check_bool(p, "prompt_logprobs") for p in scoring])):
            results[i] = result
        return results

    def results(self, jobs: list[Job],
                on_tokens: Callable[[int], None] | None = None) -> Iterator[tuple[int, EngineResult]]:
        """Queue jobs (jobs_for's) and run them to the end: (index, result) as each finishes; on_tokens(n)
        after every step that made n tokens. Jobs submitted otherwise run alongside but are not yielded."""
        with self._driving():
            self.submit(jobs)
            mine = set(jobs)
            for job in self.run(on_tokens):
                if job in mine and job.error is not None:  # its weights overflowed, or its processing gave up
                    raise failure(self.gpt, job)
                if job in mine:
                    yield job.index, job.result()

    def _record(self, job: Job, rows: np.ndarray, clock: float) -> int:
        """Record what a step computed for a job (rows [T or 1, vocab]): its prompt's scores, its next
        token, its newly full pages; the tokens it made. A job that fails ends alone."""
        made = 0
        try:
            check_finite(rows)  # the weights overflow on its ids
            if job.needs_prompt_scores:
                self._score_prompt(job, rows)
            if not job.seq.done:
                job.seq.append(job.seq.choose(rows[-1]), rows[-1], time.perf_counter() - clock)
                made = 1
        except (InputError, NumericalError) as e:
            job.error, job.status = e, Status.CANCELLED
            return 0
        if self.scheduler.prefix_cache:
            self._register(job, rows)
        if job.status is Status.PREFILL:
            job.status = Status.RUNNING
        return made

    def _score_prompt(self, job: Job, rows: np.ndarray) -> None:
        """The prompt's scores at its prefill: from the cached pages' scores, then from the rows
        computed, row r scoring token r + 1: bitwise what minigpt.score computes."""
        prompt, n, entries = job.seq.request.prompt, job.seq.request.top_logprobs, self.pool.entries
        start = job.cache.length - len(rows)  # the first position fed
        job.scores = [None]
        for j in range(1, len(prompt)):
            if j < start and j % PAGE:  # inside a cached page
                s = entries[job.cache.pages[j // PAGE]].scores
                job.scores.append((s.logprobs[j % PAGE - 1], None if s.top is None else s.top[j % PAGE - 1][:n]))
            else:  # after a cached page's last position, or after a computed row
                row = entries[job.cache.pages[j // PAGE - 1]].scores.last_row if j <= start else rows[j - 1 - start]
                job.scores.append((token_log_prob(row, prompt[j]), top_log_probs(log_softmax(row), n) if n else None))

    def _register(self, job: Job, rows: np.ndarray) -> None:
        """Put the job's newly full pages into the prefix cache, with their scores when this step
        computed them (a scoring prefill of the page's positions)."""
        first, stop = len(job.hashes), job.cache.length // PAGE
        if first == stop:  # no page filled since the last step: most decode steps
            return
        ids, start = job.seq.ids, job.cache.length - len(rows)
        parent = job.hashes[-1] if job.hashes else self.scheduler.root
        for i, h in zip(range(first, stop), chained_hashes(parent, ids, first, stop)):
            job.hashes.append(h)
            scores = None
            if job.needs_prompt_scores and i * PAGE >= start and (i + 1) * PAGE <= len(job.seq.request.prompt):
                mine = job.scores[i * PAGE + 1:(i + 1) * PAGE]
                n = job.seq.request.top_logprobs
                scores = PageScores(tuple(s[0] for s in mine), tuple(s[1] for s in mine) if n else None, n,
                                    rows[(i + 1) * PAGE - 1 - start].copy())
            self.pool.register(job.cache.pages[i], PrefixEntry(h, page_tokens(ids, i), scores))


def failure(gpt, job: Job) -> MinigptError:
    """The error of a job that could not go on, about its prompt (err.prompt): an overflow names the
    layer where it began, traced over the job's ids; a processing that gave up says why."""
    error = with_layer(gpt, job.error, job.seq.ids) if isinstance(job.error, NumericalError) else job.error
    error.prompt = job.index
    return error
