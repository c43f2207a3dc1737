"""Continuous batching: which of many requests run in the next step on one page pool that lasts.

The `Scheduler` keeps a *continuous batch* of up to `max_batch_size` sequences: one that finishes
leaves at once and a waiting one takes its place (docs/batching.md). It decides what runs and
nothing else: admission (with the prefix cache's hits, docs/prefix-cache.md), and, when the
PagePool runs out, eviction of unheld cached pages, then preemption of the latest admitted sequence,
recomputed when readmitted. A sequence whose grammar mask is not ready sits out the step.

Source: Inference Engineering (fanout.sh, inference-eng): the second fix of "The Autoregressive Loop & Cost".
"""

from __future__ import annotations

import enum
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from ..errors import MinigptError
from ..loop.sequence import GenerationResult, Sequence
from .paging import PAGE, PagedCache, PagePool, chained_hashes, page_tokens

MASK_WAIT_SECONDS = 0.05  # a step in which no sequence is ready waits this long for a mask, then returns


class Status(enum.Enum):
    """Where a job is: QUEUED -> PREFILL -> RUNNING (-> PREEMPTED -> RUNNING ...); CANCELLED at any time."""

    QUEUED = "queued"  # submitted, never computed
    PREFILL = "prefill"  # admitted for the first time: this step computes its prompt (and scores it)
    RUNNING = "running"  # computed, in the batch
    PREEMPTED = "preempted"  # computed once, its pages given back: waiting to be recomputed
    CANCELLED = "cancelled"  # asked to stop: it leaves at the next step


@dataclass(frozen=True)
class EngineResult(GenerationResult):
    """A GenerationResult from the engine, with what the engine did for it."""

    preemptions: int = 0  # times the scheduler took its cache away
    cached_tokens: int = 0  # prompt positions whose keys and values came from the prefix cache
    prompt_logprobs: list[float | None] | None = None  # [None, log P(prompt[1] | prompt[:1]), ...]; None: not asked
    prompt_top_logprobs: list[list[tuple[int, float]] | None] | None = None  # per prompt position, with top_logprobs


@dataclass(eq=False)
class Job:
    """One request in the engine: its part-3 sequence, its pages, and what the engine did for it."""

    index: int
    seq: Sequence
    cache: PagedCache
    prompt_logprobs: bool  # asked for log P(prompt[i] | prompt[:i]), scored at its prefill
    hashes: list[bytes] = field(default_factory=list)  # of its full pages in the prefix cache, in order
    cached_tokens: int = 0  # prompt positions whose keys and values came from the prefix cache
    preemptions: int = 0
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

    def result(self) -> EngineResult:
        logprobs = [None if s is None else s[0] for s in self.scores] if self.prompt_logprobs else None
        top = ([None if s is None else s[1] for s in self.scores]
               if self.prompt_logprobs and self.seq.request.top_logprobs else None)
        result = vars(self.seq.result(use_cache=True))  # a job cancelled before its end: "abort", as vLLM's
        return EngineResult(**{**result, "finish_reason": result["finish_reason"] or "abort"},
                            preemptions=self.preemptions, cached_tokens=self.cached_tokens,
                            prompt_logprobs=logprobs, prompt_top_logprobs=top)


class Scheduler:
    """Which jobs run in the next step: admission, preemption and the prefix cache's hits, over one PagePool."""

    def __init__(self, pool: PagePool, max_batch_size: int, prefix_cache: bool, root: bytes):
        self.pool, self.max_batch_size, self.prefix_cache = pool, max_batch_size, prefix_cache
        self.root = root  # the hash every page chain starts from: the model the pool serves
        self.inbox: deque[Job] = deque()  # submitted, not yet seen by a step (any thread may append)
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []  # in order of admission
        self.cached_token_hits = self.preemptions = 0
        self.masks: ThreadPoolExecutor | None = None  # the mask thread, started by the first sequence that needs it
        self.preparing: dict[Job, Future] = {}  # jobs whose next mask it computes

    def add(self, job: Job) -> None:
        """Queue a job; it joins the batch at a coming step."""
        self.inbox.append(job)

    def jobs(self) -> list[Job]:
        """Every job submitted, waiting or running."""
        return [*self.inbox, *self.waiting, *self.running]

    def pending(self) -> bool:
        """Jobs are submitted, waiting or running: a step has work (if only to let cancelled ones leave)."""
        return bool(self.inbox or self.waiting or self.running)

    def schedule(self) -> tuple[list[Job], list[Job]]:
        """The next step's jobs: take in submitted ones, drop cancelled and finished ones, make room for
        the running sequences' next positions (evicting, then preempting the newest), admit waiting
        ones while there are places and pages. Returns the jobs that left finished, and the jobs to
        run now (a prefill for the newly admitted, one token for the others)."""
        while self.inbox:
            self.waiting.append(self.inbox.popleft())
        finished = [job for job in [*self.waiting, *self.running] if job.finished]
        for job in finished:
            self._leave(job)
        preempted = self._make_room()
        if not preempted:
            self._admit()
        return finished, self._ready()

    def finish(self, jobs: list[Job]) -> list[Job]:
        """Those of a step's jobs that finished, out of the batch, their pages back in the pool."""
        finished = [job for job in jobs if job.finished]
        for job in finished:
            self._leave(job)
        return finished

    def _ready(self) -> list[Job]:
        """The running jobs that take part in this step: one whose grammar mask is still being computed
        on the mask thread sits out, so a costly mask holds up its own sequence only. With none
        ready, waits up to MASK_WAIT_SECONDS for one."""
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
                victim.preemptions += 1
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
            ids = job.seq.ids  # the hashes of its full pages before its last id (always fed: it chooses the next)
            hashes = chained_hashes(self.root, ids, 0, (len(ids) - 1) // PAGE) if self.prefix_cache else []
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

    def _take_cached(self, job: Job, ids: list[int], hashes: list[bytes]) -> None:
        """Give the job the cached pages its ids begin with (with scores, if it needs them)."""
        for i, h in enumerate(hashes):
            page = self.pool.lookup(h, page_tokens(ids, i))
            scores = None if page is None else self.pool.entries[page].scores
            if page is None or job.needs_prompt_scores and (scores is None or scores.top_n < job.seq.request.top_logprobs):
                break
            self.pool.share(job.cache, page)
            job.hashes.append(h)
        job.cache.length = len(job.hashes) * PAGE
        if job.status is Status.QUEUED:
            job.cached_tokens = job.cache.length
            self.cached_token_hits += job.cache.length
