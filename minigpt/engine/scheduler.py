"""Continuous batching: many requests decoded together on one page pool that lasts, each exactly as if alone.

Decoding one token reads every weight once; B sequences decoded in one forward share that read
(docs/batching.md). The `Scheduler` runs a *continuous batch*: it keeps up to `max_batch_size`
sequences running, each with its own sampling options and generator; a sequence that finishes
leaves at once and a waiting one takes its place in the next step, so short replies never wait
for long ones. Requests can be submitted and cancelled while others run.

Keys and values live in one PagePool (minigpt.engine.paging). When it runs out mid-generation, cached
prefix pages nobody holds are evicted first; then the most recently admitted running sequence is
*preempted*: its pages go back to the pool and it waits at the head of the queue, its keys and
values recomputed when it is readmitted.

With the prefix cache, every full page a sequence writes (prompt or generated) is kept under the
chained hash of its prefix; a later request whose ids begin with the same pages takes them
instead of computing them (`cached_tokens`). Requests that arrive together and share a prefix are
admitted one after the other, so that it is computed once. With the exact kernels a position's
keys and values depend on its prefix alone, so a reused page holds bitwise what recomputing would
write: tokens and log-probabilities are the same cold or warm, preempted or not, in any batch
(docs/paging.md).

A constrained sequence's next mask is computed on the engine's mask thread, apart from the steps: a
sequence whose mask is not ready sits out the step, so that a costly grammar holds up its own
sequence only (docs/logits-processing.md).

Source: Inference Engineering (fanout.sh, inference-eng): the second fix of "The Autoregressive Loop & Cost".
"""

from __future__ import annotations

import dataclasses
import enum
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from ..errors import InputError, MinigptError, NumericalError
from ..gpt2.forward import GPT2
from .paging import PAGE, PageKey, PagedCache, PagePool, PageScores, chained_hashes, page_hash, page_tokens
from ..exact.batched import forward_batch
from ..loop.sampling import log_softmax, token_log_prob, top_log_probs
from ..loop.sequence import GenerationResult, Request, Sequence, check_finite

MASK_WAIT_SECONDS = 0.05  # a step in which no sequence is ready waits this long for a mask, then returns


class Status(enum.Enum):
    """Where a job is: QUEUED -> PREFILL -> RUNNING (-> PREEMPTED -> RUNNING ...); CANCELLED at any time."""

    QUEUED = "queued"  # submitted, never computed
    PREFILL = "prefill"  # admitted for the first time: this step computes its prompt (and scores it)
    RUNNING = "running"  # computed, in the batch
    PREEMPTED = "preempted"  # computed once, its pages given back: waiting to be recomputed
    CANCELLED = "cancelled"  # asked to stop: it leaves at the next step


@dataclass(eq=False)
class Job:
    """One request in the engine: its sequence and cache, and what the prefix cache knows of it."""

    index: int
    seq: Sequence
    cache: PagedCache
    prompt_logprobs: bool  # asked for log P(prompt[i] | prompt[:i]), scored at its prefill
    hashes: list[bytes] = field(default_factory=list)  # of its full pages in the prefix cache, in order
    cached_tokens: int = 0  # prompt positions whose keys and values came from the prefix cache
    scores: list = field(default_factory=list)  # per prompt position: (logprob, top) or None
    status: Status = Status.QUEUED
    error: MinigptError | None = None  # why its request could not go on (it was cancelled then)

    @property
    def needs_prompt_scores(self) -> bool:
        """It still needs its prompt's scores."""
        return self.prompt_logprobs and self.status in (Status.QUEUED, Status.PREFILL)

    @property
    def prefilled(self) -> bool:
        """Its prompt was computed (and scored, if asked) in a step that completed."""
        return self.status in (Status.RUNNING, Status.PREEMPTED)

    @property
    def finished(self) -> bool:
        return self.status is Status.CANCELLED or self.seq.done and not self.needs_prompt_scores

    def result(self) -> GenerationResult:
        logprobs = [None if s is None else s[0] for s in self.scores] if self.prompt_logprobs else None
        top = ([None if s is None else s[1] for s in self.scores]
               if self.prompt_logprobs and self.seq.request.top_logprobs else None)
        result = self.seq.result(use_cache=True)  # a job cancelled before its end: finish reason "abort", as vLLM's
        return dataclasses.replace(result, finish_reason=result.finish_reason or "abort",
                                   cached_tokens=self.cached_tokens, prompt_logprobs=logprobs, prompt_top_logprobs=top)


class Scheduler:
    """Continuous batching with preemption and a prefix cache, over one PagePool, one step at a time."""

    def __init__(self, gpt: GPT2, pool: PagePool, max_batch_size: int, prefix_cache: bool):
        self.gpt, self.pool, self.max_batch_size, self.prefix_cache = gpt, pool, max_batch_size, prefix_cache
        self.root = page_hash(f"{gpt.kernels.name} {id(gpt.params)}".encode(), ())  # the pool serves one model
        self.inbox: deque[Job] = deque()  # submitted, not yet seen by a step (any thread may append)
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []  # in order of admission
        self.cached_token_hits = self.preemptions = 0
        self.masks: ThreadPoolExecutor | None = None  # the mask thread, started by the first sequence that needs it
        self.preparing: dict[Job, Future] = {}  # jobs whose next mask it computes

    def submit(self, request: Request, index: int = 0, prompt_logprobs: bool = False) -> Job:
        """Queue a checked request; it joins the batch at a coming step."""
        job = Job(index, Sequence(request), self.pool.new_cache(), prompt_logprobs)
        self.inbox.append(job)
        return job

    def cancel(self, job: Job) -> None:
        """Stop a request: at the next step it leaves, its pages back in the pool."""
        job.status = Status.CANCELLED

    def stats(self) -> dict:
        pool = self.pool
        return {"pages_total": pool.n_pages, "pages_in_use": pool.in_use, "pages_cached": len(pool.cached),
                "pages_free": int(pool.free.sum()), "cached_token_hits": self.cached_token_hits,
                "evictions": pool.evictions, "preemptions": self.preemptions}

    def in_batch(self) -> list[Job]:
        """The jobs of the running batch, oldest first (a copy)."""
        return list(self.running)

    def queued(self) -> list[Job]:
        """The jobs waiting for a place or for pages, next first (a copy)."""
        return list(self.waiting)

    def pending(self) -> bool:
        """Jobs are submitted, waiting or running: a step has work (if only to let cancelled ones leave)."""
        return bool(self.inbox or self.waiting or self.running)

    def run(self, on_step: Callable[[int], None] | None = None) -> Iterator[Job]:
        """Step until every submitted request has finished, yielding each as it finishes; on_step(new
        tokens) after every step. However it ends (an error, Ctrl-C, the caller stopping early),
        every unfinished request is cancelled and its pages are back in the pool."""
        try:
            while self.pending():
                finished, produced = self.step()
                if on_step is not None and produced:
                    on_step(produced)
                yield from finished
        finally:
            for job in [*self.inbox, *self.waiting, *self.running]:
                job.status = Status.CANCELLED
            self.step()

    def step(self) -> tuple[list[Job], int]:
        """One step: take in submitted requests, drop cancelled ones, make room for the running
        sequences' next positions (evicting, then preempting the newest), admit waiting ones while
        there are places and pages, then one forward over all running sequences (a prefill for the
        newly admitted, one token for the others). Returns the jobs that finished and the tokens made."""
        while self.inbox:
            self.waiting.append(self.inbox.popleft())
        finished = [job for job in [*self.waiting, *self.running] if job.finished]
        for job in finished:
            self._leave(job)
        preempted = self._make_room()
        if not preempted:
            self._admit()
        jobs = self._ready()
        if not jobs:
            return finished, 0
        clock = time.perf_counter()
        logits = forward_batch(self.gpt, [job.seq.ids[job.cache.length:] for job in jobs],
                               [job.cache for job in jobs], [0 if job.needs_prompt_scores else 1 for job in jobs])
        produced = 0
        for job, rows in zip(jobs, logits):  # rows [T or 1, vocab]
            try:
                check_finite(rows, job)  # the weights overflow on its ids
                if job.needs_prompt_scores:
                    self._score_prompt(job, rows)
                if not job.seq.done:
                    job.seq.append(job.seq.choose(rows[-1]), rows[-1], time.perf_counter() - clock)
                    produced += 1
            except (InputError, NumericalError) as e:  # or its processing gave up (a grammar beyond its
                job.error, job.status = e, Status.CANCELLED  # library's limits): it alone ends, the batch goes on
                continue
            if self.prefix_cache:
                self._register(job, rows)
            if job.status is Status.PREFILL:
                job.status = Status.RUNNING
        for job in [job for job in jobs if job.finished]:
            self._leave(job)
            finished.append(job)
        return finished, produced

    def _ready(self) -> list[Job]:
        """The running jobs that take part in this step. One whose next row needs work first (a
        grammar's mask) has it done on the mask thread, and sits out the steps until it is done: a
        costly mask holds up its own sequence only, never the batch (its tokens do not depend on the
        step that makes them). With none ready, waits up to MASK_WAIT_SECONDS for one."""
        for job in self.running:
            if job not in self.preparing and not job.seq.done and not job.seq.ready:
                self.masks = self.masks or ThreadPoolExecutor(1, "minigpt-masks")
                self.preparing[job] = self.masks.submit(job.seq.prepare)  # its error is raised again by choose
        if self.running and all(job in self.preparing for job in self.running):
            wait(self.preparing.values(), MASK_WAIT_SECONDS, FIRST_COMPLETED)
        ready = [job for job in self.running if job not in self.preparing or self.preparing[job].done()]
        for job in ready:
            self.preparing.pop(job, None)
        return ready

    def _leave(self, job: Job) -> None:
        if job in self.preparing:
            self.preparing.pop(job).cancel()  # not begun: never begins
        if job in self.running:
            self.running.remove(job)
        if job in self.waiting:
            self.waiting.remove(job)
        self._release(job)

    def _release(self, job: Job) -> None:
        """Give back a job's pages: it holds no place in the prefix cache any more."""
        self.pool.release(job.cache)
        job.hashes = []

    def _make_room(self) -> bool:
        """Pages for every running sequence's next position, preempting the newest while the pool is
        short. True if any was preempted (then nothing is admitted this step)."""
        preempted = False
        for job in list(self.running):  # oldest first: the newest is preempted first
            if job not in self.running:
                continue
            while not self.pool.grow(job.cache, job.cache.length + 1):
                victim = self.running.pop()
                self._release(victim)
                victim.status = Status.PREEMPTED if victim.status is Status.RUNNING else Status.QUEUED
                victim.seq.preemptions += 1
                self.preemptions += 1
                self.waiting.appendleft(victim)
                preempted = True
                if victim is job:
                    break
        return preempted

    def _admit(self) -> None:
        """Admit waiting jobs in order while there are places and pages, each taking what the
        prefix cache holds of its ids; one whose next page another job admitted now will compute
        waits a step, to take it from the cache."""
        pending: set[bytes] = set()  # hashes of the full pages this step's admitted jobs will write
        for job in list(self.waiting):
            if len(self.running) >= self.max_batch_size:
                return
            ids = job.seq.ids
            hashes = self._page_hashes(ids) if self.prefix_cache else []
            if self.prefix_cache:
                self._take_cached(job, ids, hashes)
                if len(job.hashes) < len(hashes) and hashes[len(job.hashes)] in pending:
                    self._release(job)  # its next page is being computed: take it next step
                    continue
            if not self.pool.grow(job.cache, len(ids)):
                self._release(job)
                return
            self.waiting.remove(job)
            self.running.append(job)
            job.status = Status.PREFILL if job.status is Status.QUEUED else Status.RUNNING
            pending.update(hashes[len(job.hashes):])

    def _page_hashes(self, ids: list[int]) -> list[bytes]:
        """The chained hashes of the full pages of ids before its last id (which is always fed: its
        logits choose the next token)."""
        return chained_hashes(self.root, ids, 0, (len(ids) - 1) // PAGE)

    def _take_cached(self, job: Job, ids: list[int], hashes: list[bytes]) -> None:
        """Give the job the cached pages its ids begin with (with scores, if it needs them)."""
        for i, h in enumerate(hashes):
            page = self.pool.lookup(h, page_tokens(ids, i))
            scores = None if page is None else self.pool.keys[page].scores
            if page is None or job.needs_prompt_scores and (scores is None or scores.top_n < job.seq.request.top_logprobs):
                break
            self.pool.share(job.cache, page)
            job.hashes.append(h)
        job.cache.length = len(job.hashes) * PAGE
        if job.status is Status.QUEUED:
            job.cached_tokens = job.cache.length
            self.cached_token_hits += job.cache.length

    def _score_prompt(self, job: Job, rows: np.ndarray) -> None:
        """The prompt's scores at its prefill: from the cached pages' scores, then from the rows
        computed, row r scoring token r + 1: bitwise what minigpt.score computes."""
        prompt, n = job.seq.request.prompt, job.seq.request.top_logprobs
        start = job.cache.length - len(rows)  # the first position fed
        job.scores = [None]
        for j in range(1, len(prompt)):
            if j < start and j % PAGE:  # inside a cached page
                s = self.pool.keys[job.cache.pages[j // PAGE]].scores
                job.scores.append((s.logprobs[j % PAGE - 1], None if s.top is None else s.top[j % PAGE - 1][:n]))
            else:  # after a cached page's last position, or after a computed row
                row = self.pool.keys[job.cache.pages[j // PAGE - 1]].scores.last_row if j <= start else rows[j - 1 - start]
                job.scores.append((token_log_prob(row, prompt[j]), top_log_probs(log_softmax(row), n) if n else None))

    def _register(self, job: Job, rows: np.ndarray) -> None:
        """Put the job's newly full pages into the prefix cache, with their scores when this step
        computed them (a scoring prefill of the page's positions)."""
        ids, start, first, stop = job.seq.ids, job.cache.length - len(rows), len(job.hashes), job.cache.length // PAGE
        for i, h in zip(range(first, stop), chained_hashes(job.hashes[-1] if job.hashes else self.root, ids, first, stop)):
            tokens = page_tokens(ids, i)
            job.hashes.append(h)
            scores = None
            if job.needs_prompt_scores and i * PAGE >= start and (i + 1) * PAGE <= len(job.seq.request.prompt):
                mine = job.scores[i * PAGE + 1:(i + 1) * PAGE]
                n = job.seq.request.top_logprobs
                scores = PageScores(tuple(s[0] for s in mine), tuple(s[1] for s in mine) if n else None, n,
                                    rows[(i + 1) * PAGE - 1 - start].copy())
            self.pool.register(job.cache.pages[i], PageKey(h, tokens, scores))
