"""One request being generated: its checked options, its random generator, the tokens it has
produced with their log-probabilities, and the rules that end it.

Every loop drives the same `Sequence`, so all choose, record and stop alike and a result does not
depend on the loop that produced it. A sequence ends at the first of: its end-of-text token,
`max_new_tokens` tokens, a stop string in its new text (matched on bytes, across tokens:
minigpt.loop.stops, docs/sampling.md), or a processor saying nothing may follow; never within its
first `min_tokens` tokens. It chooses from its row as its logits processing leaves it and reports
the raw row's log-probabilities.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import ContextLengthError, NumericalError, shown
from .processing import Processing
from .sampling import SamplingOptions, log_softmax, next_token, probabilities, token_log_prob, top_log_probs
from .stops import StopMatcher


@dataclass(frozen=True)
class Request:
    """A generation request, checked (minigpt.requests.request.make_request): the prompt as fed and every option."""

    prompt: tuple[int, ...]  # as fed to the model (an empty prompt becomes (<|endoftext|>,))
    max_new_tokens: int
    sampling: SamplingOptions
    eos_token_id: int | None  # the token that ends the sequence; None: none does (stop_at_eos=False)
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0
    token_bytes: Callable[[int], bytes] | None = None  # the tokenizer's; None: no text, no stop strings
    min_tokens: int = 0  # no end (eos_token_id, a stop string) within the first min_tokens new tokens
    processing: tuple[Processing, ...] = ()  # applied in this order to the logits that choose each token

    @property
    def max_positions(self) -> int:
        """Positions its cache must hold at most (see positions_needed)."""
        return positions_needed(len(self.prompt), self.max_new_tokens)


def positions_needed(prompt_len: int, max_new_tokens: int) -> int:
    """Positions a generation feeds at most: the prompt and every new token but the last, which is
    returned, never fed. It must be at most n_positions."""
    return prompt_len + max(max_new_tokens, 1) - 1


def context_error(n_positions: int, prompt_len: int, max_new_tokens: int, param: str,
                  truncatable: bool = False) -> ContextLengthError:
    """The error for a prompt and new tokens that do not fit in the context, about the argument
    `param`; truncatable: keeping the prompt's last tokens (truncate_prompt) would make them fit."""
    hint = " or keep only the prompt's last tokens ({truncate_prompt})" if truncatable else ""
    return ContextLengthError("prompt of {prompt_len} tokens + {new} new tokens need {positions} positions (the last "
                              "new token is never fed), beyond the context of {n_positions} (n_positions); shorten "
                              "them" + hint, param, prompt_len=prompt_len, new=shown(max_new_tokens),
                              positions=shown(positions_needed(prompt_len, max_new_tokens)), n_positions=n_positions)


@dataclass(frozen=True)
class GenerationResult:
    prompt_ids: list[int]  # as fed to the model (an empty prompt becomes [<|endoftext|>])
    tokens: list[int]  # the new token ids (with the end-of-text token or the stop string's last token that ended it)
    text: str | None  # the new text, ended before a stop string, without an ending <|endoftext|>; None: no tokenizer
    step_seconds: list[float]  # wall time of the step that produced each token (the first includes the prefill)
    logprobs: list[float]  # log P(token | everything before it) under the model's raw distribution
    top_logprobs: list[list[tuple[int, float]]] | None  # per token, the N most likely (id, logprob); None: not asked
    finish_reason: str  # "eos", "length" or "stop" ("abort": an engine's job cancelled before its end)
    use_cache: bool  # the cached loop (every loop but generate's naive one)


@dataclass(frozen=True)
class StreamedToken:
    """One token as `stream` yields it, once its share of the text is final. `text` is the text it
    adds: "" for a token whose bytes only begin a character (the token completing it carries it), or
    that lies past a stop string or ends the sequence; None without a tokenizer. Concatenated, the
    texts are the result's `text`."""

    token: int
    logprob: float
    top_logprobs: list[tuple[int, float]] | None
    text: str | None


def check_finite(logits: np.ndarray) -> None:
    """NumericalError unless every logit is finite: finite weights too large for float32 overflow in the
    forward, and a token cannot be chosen from NaN. One pass over the logits: what a step can afford."""
    if not np.isfinite(logits).all():
        raise NumericalError("the activations are not finite (NaN or infinity)")


@dataclass(eq=False)
class Sequence:
    """The state of one request being generated. Mutable: the loops append to it."""

    request: Request
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    released: int = 0  # tokens whose share of the text is final (what `stream` may show)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.request.sampling.seed)
        self.texts: list[str] = []  # the text each released token adds
        self._bytes = bytearray()  # the new text's bytes (an ending <|endoftext|> adds none)
        self._ends: list[int] = []  # where each token's bytes end in _bytes
        self._cut: int | None = None  # where the first stop string begins in _bytes, once found
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span tokens
        self._stops = StopMatcher(tuple(s.encode() for s in self.request.stop)) if self.request.stop else None
        self.processors = [processing.start(self.request.prompt) for processing in self.request.processing]
        if self.request.max_new_tokens == 0:
            self.finish_reason = "length"
        elif any(processor.complete for processor in self.processors):  # a grammar the empty text matches whole
            self.finish_reason = "stop"

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def ids(self) -> list[int]:
        """The whole sequence so far: prompt and new tokens."""
        return [*self.request.prompt, *self.tokens]

    def processed(self, logits: np.ndarray) -> np.ndarray:
        """One row of raw logits [vocab] as this sequence chooses from it now: the row itself when nothing
        processes it, else a float64 copy [vocab] through every processor, then the end-of-text token
        banned (-inf) while fewer than min_tokens tokens are kept (minigpt.loop.processing)."""
        eos, banned = self.request.eos_token_id, len(self.tokens) < self.request.min_tokens
        if not self.processors and not (banned and eos is not None):
            return logits
        z = logits.astype(np.float64)
        for processor in self.processors:
            processor.apply(z)
        if banned and eos is not None:
            z[eos] = -np.inf
        return z

    @property
    def ready(self) -> bool:
        """Its next row can be processed at once: no processor has work to do first (a grammar's mask
        to compute, which part 7's engine does on a thread of its own)."""
        return all(getattr(processor, "ready", True) for processor in self.processors)

    def prepare(self) -> None:
        """Do the work its processors need before its next row (compute a grammar's mask), from any
        thread while no other touches this sequence."""
        for processor in self.processors:
            if not getattr(processor, "ready", True):
                processor.prepare()

    def choose(self, logits: np.ndarray) -> int:
        """The next token from one row of logits [vocab], with this sequence's options and generator."""
        check_finite(logits)
        return next_token(self.processed(logits), self.request.sampling, self.rng)

    def probabilities(self, logits: np.ndarray) -> np.ndarray:
        """float64 [vocab]: the distribution `choose` samples from, for one row of finite logits [vocab]."""
        return probabilities(self.processed(logits), self.request.sampling)

    def append(self, token: int, logits: np.ndarray, seconds: float) -> None:
        """Record a new token, chosen from `logits` (its row [vocab]), and end the sequence if it must."""
        if self.done:
            raise RuntimeError("append to a finished sequence")
        self.tokens.append(token)
        for processor in self.processors:
            processor.advance(token)
        self.logprobs.append(token_log_prob(logits, token))  # the raw row's: processing changes no report
        if self.request.top_logprobs:
            self.top_logprobs.append(top_log_probs(log_softmax(logits), self.request.top_logprobs))
        self.seconds.append(seconds)
        if token == self.request.eos_token_id:
            self.finish_reason = "eos"
        elif self.request.token_bytes is not None:
            data = self.request.token_bytes(token)
            counting = len(self.tokens) > self.request.min_tokens
            if self._stops is not None and (cut := self._stops.feed(data, counting)) is not None:
                self._cut, self.finish_reason = cut, "stop"
            self._bytes += data
        self._ends.append(len(self._bytes))
        if not self.done and any(processor.complete for processor in self.processors):
            self.finish_reason = "stop"  # the text matches its grammar whole: nothing may follow
        if not self.done and len(self.tokens) == self.request.max_new_tokens:
            self.finish_reason = "length"
        self._release()

    def _release(self) -> None:
        """Give each token whose bytes can no longer be cut by a stop string its share of the text."""
        if self.request.token_bytes is None:
            self.released = len(self.tokens)
            return
        final = len(self._bytes) if self.done or self._stops is None else self._stops.open_from
        cut = len(self._bytes) if self._cut is None else self._cut
        while self.released < len(self.tokens) and self._ends[self.released] <= final:
            i = self.released
            start = self._ends[i - 1] if i else 0
            last = self.done and i == len(self.tokens) - 1  # then bytes left in the decoder become U+FFFD
            self.texts.append(self._decoder.decode(self._bytes[start:min(self._ends[i], cut)], last))
            self.released += 1

    def result(self, use_cache: bool) -> GenerationResult:
        return GenerationResult(
            list(self.request.prompt), list(self.tokens), None if self.request.token_bytes is None else "".join(self.texts),
            list(self.seconds), list(self.logprobs),
            [list(t) for t in self.top_logprobs] if self.request.top_logprobs else None,
            self.finish_reason, use_cache)

    def streamed(self, start: int) -> list[StreamedToken]:
        """Records of the released tokens from index `start` on."""
        top = self.top_logprobs if self.request.top_logprobs else None
        texts = self.texts if self.request.token_bytes is not None else None
        return [StreamedToken(self.tokens[i], self.logprobs[i], None if top is None else top[i],
                              None if texts is None else texts[i])
                for i in range(start, self.released)]
