"""A job: one request in the engine, its part-3 sequence and what the engine did for it (its pages,
where it is, its prompt's scores), and the result the engine gives it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from ..errors import MinigptError
from ..loop.sequence import GenerationResult, Sequence
from .paging import PagedCache


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
