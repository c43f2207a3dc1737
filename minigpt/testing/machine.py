"""The engine as a Hypothesis state machine: submits, cancels, steps and runs to the end, interleaved
at random on one Engine whose pool is from the smallest that fits the largest request up, so that it
evicts, preempts, readmits with prefix hits, and takes prompts that are exact page multiples or
wholly cached (the cases of nano-vllm's issues #144, #211 and #233).

After every rule the pool's pages and the jobs are checked whole (each page once, its count its
holders', a cached page's keys its prefix's), and an ended job's tokens and log-probabilities are
bitwise its run alone (a cancelled job's, a prefix of them). docs/testing.md shows how to run it.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib

from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ..cache.kv_cache import KVCache, forward_cached
from ..engine.engine import Engine
from ..engine.paging import PAGE, chained_hashes, page_tokens, pages_for
from ..engine.job import Job, Status
from ..exact.kernels import EXACT
from ..loading.model import Model
from ..requests.request import check_options, make_request
from ..loading.weights import params_to_tensors
from ..api.api import generate, score
from .bits import assert_bitwise
from .strategies import models, options, prompts


def settling(check):
    """A rule or invariant that marks the machine unsettled while it runs: a run that stops inside
    one (an assertion, an error) is not driven on in teardown, whose errors would hide the first."""
    @functools.wraps(check)
    def marked(self, *args, **kwargs):
        self.settled = False
        check(self, *args, **kwargs)
        self.settled = True
    return marked


def shared(a: list[int], b: list[int]) -> int:
    """How many ids a and b begin with alike."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class Shown:
    """A drawn model as a falsifying example shows it: its configuration and its weights' digest."""

    def __init__(self, model: Model):
        self.model = model

    def __repr__(self) -> str:
        digest = hashlib.blake2b(b"".join(w.tobytes() for w in params_to_tensors(self.model.params).values()),
                                 digest_size=8).hexdigest()
        return f"Model({self.model.config}, weights blake2b {digest})"


class EngineMachine(RuleBasedStateMachine):
    """The Engine as a state machine; `EngineMachine.TestCase` runs it under pytest or unittest. A
    subclass sets `model` (a Model with the exact kernels, or a strategy of them), `max_batch_sizes`
    and `spare_pages` (strategies: pages beyond the largest request's), `max_jobs` and `constrained`."""

    model: Model | st.SearchStrategy = models(min_positions=2 * PAGE + 1)
    max_batch_sizes: st.SearchStrategy = st.integers(1, 4)
    spare_pages: st.SearchStrategy = st.integers(0, 1) | st.integers(2, 8)  # tight, or room for several
    max_jobs = 8
    constrained = False
    rules_run = 0  # by every run of this class, for the long profile's count

    @initialize(data=st.data())
    def start(self, data):
        self.gpt = self.model if isinstance(self.model, Model) else data.draw(self.model.map(Shown), label="model").model
        assert self.gpt.kernels is EXACT, "the engine is exact with the exact kernels only"
        n = self.gpt.config.n_positions
        self.largest = data.draw(st.integers(min(PAGE + 1, n), n) | st.integers(1, n), label="largest request")
        pool = pages_for(self.largest) + data.draw(self.spare_pages, label="spare pages")
        batch = data.draw(self.max_batch_sizes, label="max_batch_size")
        prefix_cache = data.draw(st.sampled_from([True, True, False]), label="prefix cache")
        self.engine = Engine(self.gpt, max_batch_size=batch, kv_cache_tokens=pool * PAGE, prefix_cache=prefix_cache)
        self.jobs: list[Job] = []
        self.asked: dict[Job, tuple] = {}  # job -> (its request's keywords, prompt_logprobs, speculate alone)
        self.ended: set[Job] = set()
        self.cancelled: dict[Job, bool] = {}  # by the cancel rule: whether it was done then
        self.references: dict[Job, KVCache] = {}  # each job's keys and values, computed alone
        for _ in range(data.draw(st.integers(1, self.max_jobs // 2), label="requests at the start")):
            self.submit_one(data)

    # ------------------------------------------------------------------------------ rules

    @precondition(lambda self: len(self.jobs) < self.max_jobs)
    @rule(data=st.data())
    @settling
    def submit(self, data):
        self.submit_one(data)

    def submit_one(self, data) -> None:
        """A request of any options whose prompt and new tokens fit the largest request."""
        prompt = data.draw(prompts(self.gpt.config, self.largest, [list(job.seq.ids) for job in self.jobs]))
        most = self.largest - len(prompt) + 1
        n = data.draw(st.just(most) | st.integers(0, most), label="max_new_tokens")  # the most fills the pool
        keywords = {"prompt_ids": prompt, "max_new_tokens": n,
                    **data.draw(options(self.gpt, n, self.constrained), label="options")}
        greedy = keywords.get("temperature", 0) == 0
        speculate = data.draw(st.sampled_from([None, "ngram"] if greedy else [None]), label="alone, speculating")
        event(f"a prompt of {'whole pages' if len(prompt) % PAGE == 0 else 'a part page'}")
        # prompt_logprobs: first the opposite of the job this prompt shares most with, so that pages
        # computed with and without their scores meet in the prefix cache
        sharer = max(self.jobs, key=lambda job: shared(job.seq.ids, prompt), default=None)
        opposite = sharer is not None and not sharer.prompt_logprobs
        request = make_request(self.gpt, prompt, check_options({k: v for k, v in keywords.items() if k != "prompt_ids"}),
                               truncation_offered=False)
        [job] = self.engine.jobs_for([request], [data.draw(st.sampled_from([opposite, not opposite]),
                                                           label="prompt_logprobs")])
        self.engine.submit([job])
        self.jobs.append(job)
        self.asked[job] = (keywords, job.prompt_logprobs, speculate)

    def _cancellable(self) -> list[Job]:
        return [job for job in self.jobs if job not in self.ended and job.status is not Status.CANCELLED]

    @precondition(lambda self: self._cancellable())
    @rule(data=st.data())
    @settling
    def cancel(self, data):
        """Cancel a job submitted, waiting or running (it leaves at the next step)."""
        job = data.draw(st.sampled_from(self._cancellable()), label="cancelled")
        event(f"cancel a {job.status.value} job")
        self.engine.cancel(job)
        self.cancelled[job] = job.seq.done  # a request of no new tokens is done before any step

    @precondition(lambda self: self.engine.pending())
    @rule()
    @settling
    def step(self):
        self._ended(self.engine.step()[0])
        assert set(self.cancelled) <= self.ended, "a job cancelled did not leave at the next step"

    @rule()
    @settling
    def run_to_the_end(self):  # always enabled: a run that submits nothing more ends with it
        self._ended(list(self.engine.run()))
        assert not self.engine.pending() and self.engine.pool.in_use == 0

    def teardown(self):
        if getattr(self, "settled", False):
            self._ended(list(self.engine.run()))
            assert self.ended == set(self.jobs), "a job never ended"

    def _ended(self, finished: list[Job]) -> None:
        """Each job ends once, holding nothing, with bitwise its result alone (cancelled: a prefix of it)."""
        for job in finished:
            assert job not in self.ended, f"job {self.jobs.index(job)} ended twice"
            assert job.cache.pages == [] and job.hashes == [], f"job {self.jobs.index(job)} ended holding pages"
            self.ended.add(job)
            keywords, scored, speculate = self.asked[job]
            alone = generate(self.gpt, speculate=speculate, **keywords)
            result = job.result()
            if job.status is Status.CANCELLED:
                assert self.cancelled.get(job, True) or result.finish_reason == "abort", \
                    f"cancelled job {self.jobs.index(job)} ended {result.finish_reason!r}"
                n = len(result.tokens)
                assert_bitwise((result.tokens, result.logprobs), (alone.tokens[:n], alone.logprobs[:n]),
                               f"cancelled job {self.jobs.index(job)}'s (tokens, logprobs) vs its run alone")
                continue
            assert_bitwise(dataclasses.replace(result, prompt_logprobs=None, prompt_top_logprobs=None), alone,
                           f"job {self.jobs.index(job)} vs its run alone")
            if scored and len(keywords["prompt_ids"]) > 1:
                assert_bitwise(result.prompt_logprobs[1:], score(self.gpt, keywords["prompt_ids"]).tolist(),
                               f"job {self.jobs.index(job)}'s prompt_logprobs vs score")

    # ------------------------------------------------------------------------- invariants

    @invariant()
    @settling
    def pages_add_up(self):
        """Free + held + cached = all, each page in one of them; a page's references are its holders."""
        if not hasattr(self, "engine"):
            return
        pool, holders = self.engine.pool, [0] * self.engine.pool.n_pages
        for job in self.jobs:
            assert len(set(job.cache.pages)) == len(job.cache.pages), f"job {self.jobs.index(job)} holds a page twice"
            for page in job.cache.pages:
                holders[page] += 1
        held = {page for page, n in enumerate(holders) if n}
        free = {page for page in range(pool.n_pages) if pool.free[page]}
        cached = set(pool.cached)
        assert list(pool.refs) == holders, f"reference counts {list(pool.refs)} != holders {holders}"
        assert not free & held and not free & cached and not held & cached, "a page in two states"
        lost = set(range(pool.n_pages)) - free - held - cached
        assert not lost, f"pages neither free, held nor cached: {lost}"
        assert cached <= set(pool.entries) and set(pool.by_hash.values()) == set(pool.entries), "cache maps disagree"
        stats = self.engine.stats()
        assert (stats["pages_in_use"], stats["pages_cached"], stats["pages_free"]) == (len(held), len(cached), len(free))

    @invariant()
    @settling
    def cached_pages_hold_their_whole_prefix(self):
        """A page in the prefix cache is kept under its whole prefix's hash, with its tokens, and holds
        that prefix's keys and values, bitwise."""
        if not hasattr(self, "engine"):
            return
        prefixes = {}  # hash -> (a job, page index) whose ids have that prefix
        for job in self.jobs:
            full = len(job.seq.ids) // PAGE
            for i, h in enumerate(chained_hashes(self.engine.scheduler.root, job.seq.ids, 0, full)):
                prefixes.setdefault(h, (job, i))
        pool = self.engine.pool
        for page, entry in pool.entries.items():
            assert entry.hash in prefixes, f"page {page} is cached under a hash no prefix seen has"
            job, i = prefixes[entry.hash]
            assert entry.tokens == page_tokens(job.seq.ids, i), f"page {page}'s tokens are not its prefix's"
            self._assert_holds(job, page, i, "cached page")

    @invariant()
    @settling
    def jobs_are_where_their_state_says(self):
        """Every job not ended is in exactly one queue; its state, cache and counts agree."""
        if not hasattr(self, "engine"):
            return
        engine, scheduler = self.engine, self.engine.scheduler
        places = scheduler.jobs()
        assert len(places) == len(set(places)), "a job is queued twice"
        assert set(places) == set(self.jobs) - self.ended, "a job is lost, or ended and still queued"
        assert len(scheduler.running) <= engine.max_batch_size
        assert scheduler.preemptions == sum(job.preemptions for job in self.jobs)
        for job in self.jobs:
            seq = job.seq
            assert len(seq.tokens) == len(seq.logprobs) <= seq.request.max_new_tokens
            if job in scheduler.running and job.status is not Status.CANCELLED:
                assert job.status is Status.RUNNING and job.cache.length == len(seq.ids) - 1
                assert pages_for(job.cache.length) <= len(job.cache.pages) <= pages_for(job.cache.length + 1)
                assert job.hashes == chained_hashes(scheduler.root, seq.ids, 0, len(job.hashes))
                assert len(job.hashes) <= job.cache.length // PAGE
                for i, page in enumerate(job.cache.pages[:pages_for(job.cache.length)]):
                    self._assert_holds(job, page, i, "running job's page", job.cache.length)
            elif job in scheduler.waiting or job in scheduler.inbox:
                assert job.cache.pages == [] and job.hashes == []
                assert job.status in (Status.QUEUED, Status.PREEMPTED, Status.CANCELLED)
        for name in ("preemptions", "evictions", "cached_token_hits"):
            if engine.stats()[name]:
                event(f"a run with {name}")  # how often the runs reach what they are for (--hypothesis-show-statistics)
        EngineMachine.rules_run += 1

    def _assert_holds(self, job: Job, page: int, i: int, what: str, length: int | None = None) -> None:
        """Pool page `page` holds the keys and values of page i of job's ids (its first `length`
        positions), bitwise those the job's ids give alone."""
        stop = (i + 1) * PAGE if length is None else min((i + 1) * PAGE, length)
        reference = self.references.setdefault(job, self.gpt.new_cache(self.gpt.config.n_positions))
        if reference.length < stop:
            forward_cached(self.gpt, job.seq.ids[reference.length:stop], reference)
        pool, n = self.engine.pool, stop - i * PAGE
        for name, store, mine in (("keys", pool.k, reference.k), ("values", pool.v, reference.v)):
            assert_bitwise(store[:, :, page * PAGE:page * PAGE + n], mine[:, :, i * PAGE:stop],
                           f"{what} {page} (job {self.jobs.index(job)}'s page {i}) {name}")
