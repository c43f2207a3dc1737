"""Continuous batching: which of many requests run in the next step on one page pool that lasts.

The `Scheduler` keeps a *continuous batch* of up to `max_batch_size` sequences: one that finishes
leaves at once and a waiting one takes its place (docs/batching.md). It decides what runs and
nothing else: admission (with the prefix cache's hits, docs/prefix-cache.md), and, when the
PagePool runs out, eviction of unheld cached pages, then preemption of the latest admitted sequence,
recomputed when readmitted.

Source: Inference Engineering (fanout.sh, inference-eng): the second fix of "The Autoregressive Loop & Cost".
"""

from __future__ import annotations

from collections import deque

from .job import Job, Status
from .paging import PAGE, PagePool, chained_hashes, page_tokens

class Scheduler:
    """Which jobs run in the next step: admission, preemption and the prefix cache's hits, over one PagePool."""

    def __init__(self, pool: PagePool, max_batch_size: int, prefix_cache: bool, root: bytes):
        self.pool, self.max_batch_size, self.prefix_cache = pool, max_batch_size, prefix_cache
        self.root = root  # the hash every page chain starts from: the model the pool serves
        self.inbox: deque[Job] = deque()  # submitted, not yet seen by a step (any thread may append)
        self.waiting: deque[Job] = deque()
        self.running: list[Job] = []  # in order of admission
        self.cached_token_hits = self.preemptions = 0

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
        return finished, list(self.running)

    def finish(self, jobs: list[Job]) -> list[Job]:
        """Those of a step's jobs that finished, out of the batch, their pages back in the pool."""
        finished = [job for job in jobs if job.finished]
        for job in finished:
            self._leave(job)
        return finished

    def _leave(self, job: Job) -> None:
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
