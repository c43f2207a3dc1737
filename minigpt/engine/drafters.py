"""Drafters, the guessers of speculative decoding (minigpt.engine.speculative), and their contract.

`NGramDrafter` (prompt lookup), `ModelDrafter` (a smaller model with the same vocabulary), or any
object with the `Drafter` methods, its every proposal checked before the model trusts it
(`CheckedDrafter`; docs/speculative.md).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ..errors import ContextLengthError, DrafterError, InputError, check_ids, check_int, shown
from ..gpt2.forward import GPT2
from ..cache.kv_cache import forward_cached, new_cache
from ..loop.sampling import SamplingOptions, draw, probabilities

MAX_NGRAM = 3  # prompt lookup tries the last 3, then 2, then 1 tokens
DRAFT_TOKENS = 4  # draft_tokens by default: k's ceiling (the room left for new tokens caps it too)


class Drafter(Protocol):
    """What the loop needs from a drafter."""

    def propose(self, ids: list[int], k: int, options: SamplingOptions,
                rng: np.random.Generator) -> tuple[list[int], np.ndarray | None]:
        """Up to k guessed tokens after `ids`, and q [n, vocab], the probability of each guess's
        position under the drafter (None: certain guesses, q one-hot)."""
        ...

    def accepted(self, n_positions: int) -> None:
        """The sequence now holds its first n_positions tokens for good: forget any guess past them."""
        ...


class NGramDrafter:
    """Prompt lookup: propose the tokens that followed the latest earlier occurrence of the
    context's last n tokens (n = MAX_NGRAM down to 1), continuing a repetition of a short period."""

    def propose(self, ids, k, options, rng):
        arr = np.asarray(ids)
        for n in range(min(MAX_NGRAM, len(arr) - 1), 0, -1):
            windows = np.lib.stride_tricks.sliding_window_view(arr[:-1], n)  # every earlier n-gram
            hits = np.flatnonzero((windows == arr[-n:]).all(axis=1))
            if hits.size:
                follows = arr[hits[-1] + n:]  # what followed the latest occurrence, up to now
                return follows[np.arange(k) % follows.size].tolist(), None  # repeated with its period
        return [], None

    def accepted(self, n_positions):
        pass


class ModelDrafter:
    """A smaller model that guesses with its own KV cache, one token at a time."""

    def __init__(self, draft: GPT2, capacity: int):
        self.draft = draft
        self.cache = new_cache(draft.config, capacity)

    def propose(self, ids, k, options, rng):
        tokens, q = [], []
        for _ in range(k):
            start = self.cache.length
            logits = forward_cached(self.draft, [*ids, *tokens][start:], self.cache, logits_to_keep=1)[0]
            if not np.isfinite(logits).all():  # the draft model overflowed: fewer drafts, none of its numbers kept
                self.cache.truncate(start)
                break
            if options.temperature == 0:
                tokens.append(int(np.argmax(logits)))
            else:
                probs = probabilities(logits, options)
                tokens.append(draw(probs / probs.sum(), rng))
                q.append(probs)
        return tokens, (np.stack(q) if q else None)

    def accepted(self, n_positions):
        self.cache.truncate(min(self.cache.length, n_positions))


def check_speculation(model: GPT2, speculate, draft_tokens: int | None, max_positions: int) -> tuple[Drafter, int]:
    """The drafter `speculate` names, checked against the model and the request, and the most
    drafts per step (draft_tokens, default DRAFT_TOKENS)."""
    draft_tokens = check_int(DRAFT_TOKENS if draft_tokens is None else draft_tokens, "draft_tokens", 1)
    if isinstance(speculate, str):
        if speculate != "ngram":
            raise InputError("{speculate} must be 'ngram', a draft model or a drafter, got {value}", "speculate",
                             value=shown(speculate))
        return NGramDrafter(), draft_tokens
    if isinstance(speculate, type):
        raise InputError("{speculate} got the class {value}: give an instance, {value}(...)", "speculate",
                         value=speculate.__name__)
    if not isinstance(speculate, GPT2):
        if callable(getattr(speculate, "propose", None)) and callable(getattr(speculate, "accepted", None)):
            return CheckedDrafter(speculate, model.config.vocab_size), draft_tokens
        raise InputError("{speculate} must be 'ngram', a draft model or a drafter, got {value}", "speculate",
                         value=type(speculate).__name__)
    if speculate.config.vocab_size != model.config.vocab_size:
        raise InputError(f"the draft model's vocabulary has {speculate.config.vocab_size} tokens and the "
                         f"model's {model.config.vocab_size}: a draft must share the model's vocabulary", "speculate")
    if max_positions > speculate.config.n_positions:
        raise ContextLengthError(f"this request needs {max_positions} positions and the draft model's context "
                                 f"holds {speculate.config.n_positions} (n_positions)", "speculate")
    return ModelDrafter(speculate, max_positions), draft_tokens


Q_TOLERANCE = 1e-6  # how far a row of q may sum from 1: float32 rounding, not a distribution forgotten


class CheckedDrafter:
    """A drafter of one's own whose every proposal is checked against the contract (check_proposal)
    before the model trusts it; NGramDrafter and ModelDrafter keep it by construction."""

    def __init__(self, drafter: Drafter, vocab_size: int):
        self.drafter, self.vocab_size = drafter, vocab_size

    def propose(self, ids, k, options, rng):
        return check_proposal(self.drafter, self.drafter.propose(ids, k, options, rng), k, self.vocab_size)

    def accepted(self, n_positions):
        self.drafter.accepted(n_positions)


def check_proposal(drafter: Drafter, proposal, k: int, vocab_size: int) -> tuple[list[int], np.ndarray | None]:
    """A drafter's `propose` result checked: (drafts, q) with at most k token ids in the vocabulary and
    q None or [len(drafts), vocab] probabilities (finite, >= 0, each row summing to 1, every draft's
    own > 0: the acceptance rule min(1, p/q) divides by it, and a q of zeros would accept every
    draft). A breach is a DrafterError naming the drafter and what it returned; O(k * vocab)."""
    def breach(problem: str) -> DrafterError:
        return DrafterError(f"the drafter {type(drafter).__name__}'s propose returned {problem}; it must return "
                            f"(drafts, q): at most {k} token ids and None or their probabilities [n, {vocab_size}]")

    if not isinstance(proposal, tuple) or len(proposal) != 2:
        raise breach(f"{type(proposal).__name__} {shown(proposal)}")
    drafts, q = proposal
    try:
        drafts = check_ids(drafts, vocab_size, "drafts").tolist()
    except InputError as e:
        raise breach(f"drafts that are no token ids ({e})") from None
    if len(drafts) > k:
        raise breach(f"{len(drafts)} drafts where {k} were asked for")
    if q is None:
        return drafts, None
    try:
        array = np.asarray(q)
    except ValueError:  # ragged rows
        raise breach(f"a q that is no array of numbers ({type(q).__name__})") from None
    if array.dtype.kind not in "biuf":  # complex would lose its imaginary part, objects and text fail later
        raise breach(f"a q that is no array of real numbers ({type(q).__name__} of {array.dtype})")
    q = array.astype(np.float64)
    if q.shape != (len(drafts), vocab_size):
        raise breach(f"q of shape {list(q.shape)} for {len(drafts)} drafts")
    if not np.isfinite(q).all() or (q < 0).any():
        raise breach("a q with negative, NaN or infinite probabilities")
    sums = q.sum(axis=1)
    if (abs(sums - 1) > Q_TOLERANCE).any():
        i = int(np.argmax(abs(sums - 1)))
        raise breach(f"a q whose row {i} sums to {sums[i]:.6g}, not 1")
    if drafts and (q[np.arange(len(drafts)), drafts] <= 0).any():
        i = int(np.flatnonzero(q[np.arange(len(drafts)), drafts] <= 0)[0])
        raise breach(f"draft {i} ({drafts[i]}) with probability 0 in its row of q")
    return drafts, q
