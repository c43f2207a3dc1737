"""One request being generated: its checked options, its random generator, the tokens it has
produced with their log-probabilities, and the rules that end it.

Every loop drives the same `Sequence`: the naive and the cached loop (minigpt.loops), speculative
decoding (minigpt.speculative) and batched generation (minigpt.batching). So they choose, record
and stop alike, and a sequence's result does not depend on which loop produced it.

A sequence ends at the first of: its end-of-text token (`stop_at_eos`), `max_new_tokens` tokens,
or a stop string in its new text. Stop strings are matched on the UTF-8 bytes of the new tokens, so
across token boundaries. The result then ends with the last whole token before the stop string
that also ends a character: a token that straddles the boundary (part of its text before the stop
string, part inside it) is dropped with its text, so that `tokens`, `logprobs` and the text always
agree (docs/sampling.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .errors import ContextLengthError, NumericalError
from .sampling import SamplingOptions, log_softmax, next_token, token_log_prob, top_log_probs


@dataclass(frozen=True)
class Request:
    """A generation request, checked: the prompt as fed and every option."""

    prompt: tuple[int, ...]  # as fed to the model (an empty prompt becomes (<|endoftext|>,))
    max_new_tokens: int
    sampling: SamplingOptions
    eos_token_id: int | None  # the token that ends the sequence; None: none does (stop_at_eos=False)
    stop: tuple[str, ...] = ()
    top_logprobs: int = 0
    token_bytes: Callable[[int], bytes] | None = None  # a token's text as bytes: needed to match stop strings

    @property
    def max_positions(self) -> int:
        """Positions its cache must hold at most: the prompt and every new token but the last (never fed)."""
        return len(self.prompt) + max(self.max_new_tokens, 1) - 1


def context_error(n_positions: int, prompt_len: int, max_new_tokens: int, hint: str = "") -> ContextLengthError:
    """The error for a prompt and new tokens that do not fit in the context; `hint`: another way out."""
    return ContextLengthError(f"prompt of {prompt_len} tokens + {max_new_tokens} new tokens exceeds the context of "
                              f"{n_positions} (n_positions); shorten them{hint}")


@dataclass(frozen=True)
class GenerationResult:
    prompt_ids: list[int]  # as fed to the model (an empty prompt becomes [<|endoftext|>])
    tokens: list[int]  # the new token ids (with the end-of-text token when that ended it)
    step_seconds: list[float]  # wall time of the step that produced each token (the first includes the prefill)
    logprobs: list[float]  # log P(token | everything before it) under the model's raw distribution
    top_logprobs: list[list[tuple[int, float]]] | None  # per token, the N most likely (id, logprob); None: not asked
    finish_reason: str  # "eos", "length" or "stop"
    use_cache: bool  # the cached loop (every loop but generate's naive one)
    preemptions: int = 0  # times a batch scheduler took its cache away (minigpt.batching)
    drafted: int = 0  # tokens proposed by a speculative drafter (minigpt.speculative)
    accepted: int = 0  # of those, how many the model accepted
    cached_tokens: int = 0  # prompt positions whose keys and values came from an engine's prefix cache
    prompt_logprobs: list[float | None] | None = None  # [None, log P(prompt[1] | prompt[:1]), ...]; None: not asked
    prompt_top_logprobs: list[list[tuple[int, float]] | None] | None = None  # per prompt position, with top_logprobs


@dataclass(frozen=True)
class StreamedToken:
    """One token as `stream` yields it."""

    token: int
    logprob: float
    top_logprobs: list[tuple[int, float]] | None


def incomplete_tail(data: bytes | bytearray) -> int:
    """How many bytes at the end of `data` begin a UTF-8 character that is not complete yet (0 to 3)."""
    for i in range(1, min(3, len(data)) + 1):
        b = data[-i]
        if b & 0xC0 == 0x80:  # a continuation byte: the character began further back
            continue
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return i if need > i else 0
    return 0


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
    released: int = 0  # tokens that can no longer be cut by a stop string (what `stream` may show)
    preemptions: int = 0
    drafted: int = 0
    accepted: int = 0

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.request.sampling.seed)
        self._text = bytearray()  # the new tokens' bytes, for stop strings
        self._ends: list[int] = []  # where each token's bytes end in _text
        self._stops = [s.encode() for s in self.request.stop]
        if self.request.max_new_tokens == 0:
            self.finish_reason = "length"

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def ids(self) -> list[int]:
        """The whole sequence so far: prompt and new tokens."""
        return [*self.request.prompt, *self.tokens]

    def choose(self, logits: np.ndarray) -> int:
        """The next token from one row of logits [vocab], with this sequence's options and generator."""
        check_finite(logits)
        return next_token(logits, self.request.sampling, self.rng)

    def append(self, token: int, logits: np.ndarray, seconds: float) -> None:
        """Record a new token, chosen from `logits` (its row [vocab]), and end the sequence if it must."""
        if self.done:
            raise RuntimeError("append to a finished sequence")
        self.tokens.append(token)
        self.logprobs.append(token_log_prob(logits, token))
        if self.request.top_logprobs:
            self.top_logprobs.append(top_log_probs(log_softmax(logits), self.request.top_logprobs))
        self.seconds.append(seconds)
        if token == self.request.eos_token_id:
            self._finish("eos")
        elif self._stops and self._match(token):
            self._finish("stop")
        elif len(self.tokens) == self.request.max_new_tokens:
            self._finish("length")
        elif not self._stops:
            self.released = len(self.tokens)

    def _match(self, token: int) -> bool:
        """Add the token's bytes; on a stop string, cut the sequence back before it and say so."""
        before = len(self._text)
        self._text += self.request.token_bytes(token)
        self._ends.append(len(self._text))
        longest = max(map(len, self._stops))
        window = max(0, before - longest + 1)  # a new match must end in the new bytes
        found = [i for i in (self._text.find(s, window) for s in self._stops) if i >= 0]
        if found:
            at = min(found)
            keep = sum(1 for end in self._ends if end <= at)
            while keep and incomplete_tail(self._text[:self._ends[keep - 1]]):  # never end inside a character
                keep -= 1
            self._cut(keep)
            return True
        hold = next((i for i in range(max(0, len(self._text) - longest + 1), len(self._text))
                     if any(s.startswith(self._text[i:]) for s in self._stops)), len(self._text))
        safe = min(hold, len(self._text) - incomplete_tail(self._text))
        self.released = sum(1 for end in self._ends if end <= safe)
        return False

    def _cut(self, keep: int) -> None:
        del self.tokens[keep:], self.logprobs[keep:], self.seconds[keep:], self._ends[keep:]
        del self.top_logprobs[keep:]
        del self._text[self._ends[-1] if self._ends else 0:]

    def _finish(self, reason: str) -> None:
        self.finish_reason = reason
        self.released = len(self.tokens)

    def result(self, use_cache: bool) -> GenerationResult:
        return GenerationResult(
            list(self.request.prompt), list(self.tokens), list(self.seconds), list(self.logprobs),
            [list(t) for t in self.top_logprobs] if self.request.top_logprobs else None,
            self.finish_reason, use_cache, self.preemptions, self.drafted, self.accepted)

    def streamed(self, start: int) -> list[StreamedToken]:
        """Records of the released tokens from index `start` on."""
        top = self.top_logprobs if self.request.top_logprobs else None
        return [StreamedToken(self.tokens[i], self.logprobs[i], None if top is None else top[i])
                for i in range(start, self.released)]


def generated_text(tokenizer, result: GenerationResult) -> str:
    """The new text: the tokens decoded (bytes that are not UTF-8 replaced), without the
    <|endoftext|> that ended the sequence."""
    tokens = result.tokens[:-1] if result.finish_reason == "eos" else result.tokens
    return tokenizer.decode_bytes(tokens).decode("utf-8", errors="replace")
