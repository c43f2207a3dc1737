"""Speculative decoding: guess several tokens cheaply, verify them all in one forward of the model.

A forward over k + 1 rows costs little more than over one (the weights are read once), so verifying
k drafts (minigpt.engine.drafters) can give up to k + 1 tokens for about the price of one. Row i of
the logits over [last token, d1 .. dk] is, with the exact kernels, bitwise the row plain decoding
computes after d1 .. di. Greedy keeps plain greedy decoding's tokens bit for bit; sampling uses
Leviathan et al.'s rule, so every token is distributed as the model's own sample. Row i is processed
only once the drafts before it are kept. k adapts to the drafter's success (docs/speculative.md).

Source: Inference Engineering (fanout.sh, inference-eng): the third fix of "The Autoregressive Loop & Cost".
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..gpt2.forward import GPT2
from ..cache.kv_cache import forward_cached, new_cache
from ..loop.sampling import draw
from ..loop.sequence import GenerationResult, Sequence, check_finite
from .drafters import Drafter

MAX_WAIT = 64  # plain steps at most between two single-draft tries


@dataclass
class DraftCounts:
    """One sequence's drafts, counted as speculative_steps goes: tokens proposed, and accepted."""

    drafted: int = 0
    accepted: int = 0


@dataclass(frozen=True)
class SpeculativeResult(GenerationResult):
    """A GenerationResult of speculative decoding, with its drafts counted."""

    drafted: int = 0  # tokens proposed by the drafter
    accepted: int = 0  # of those, how many the model accepted


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Where a rejected draft's replacement is drawn from: max(p - q, 0), normalised (p itself when
    p equals q up to rounding and nothing is left)."""
    r = np.maximum(p - q, 0.0)
    return r / r.sum() if r.sum() > 0 else p / p.sum()


def judge(p: np.ndarray, q: np.ndarray | None, draft: int, rng: np.random.Generator) -> tuple[int, bool]:
    """Speculative sampling's rule for one draft, p and q [vocab] the model's and the drafter's
    distributions (q None: one-hot at the draft): (the draft, True) with probability min(1, p/q),
    else (a token drawn from the residual, False)."""
    q = np.eye(1, p.size, draft)[0] if q is None else q
    if rng.random() * q[draft] < p[draft]:  # probability min(1, p/q) without dividing
        return draft, True
    r = residual(p, q)
    return draw(r, rng), False


def verify(seq: Sequence, logits: np.ndarray, drafts: list[int], q: np.ndarray | None, seconds: float) -> int:
    """Check the drafts against the model's rows [n+1, vocab] and append the tokens kept: the
    accepted drafts, then the model's own token (a correction, or the bonus after the last draft).
    Returns how many drafts were kept."""
    kept = 0
    for i, row in enumerate(logits):
        if i == len(drafts):
            token, accepted = seq.choose(row), False
        elif seq.request.sampling.temperature == 0:
            token = seq.choose(row)
            accepted = token == drafts[i]
        else:
            token, accepted = judge(seq.probabilities(row), None if q is None else q[i], drafts[i], seq.rng)
        seq.append(token, row, seconds)
        if not accepted:
            break
        kept += 1
        if seq.done:
            break
    return kept


def speculative_steps(gpt: GPT2, seq: Sequence, drafter: Drafter, draft_tokens: int,
                      counts: DraftCounts) -> Iterator[None]:
    """The cached loop with drafts: each step proposes up to k tokens, verifies them in one forward
    and appends the tokens it keeps to `seq`, counting them in `counts`. Yields after every step."""
    request, options = seq.request, seq.request.sampling
    cache = new_cache(gpt.config, request.max_positions)
    k, wait, idle = draft_tokens, 1, 0
    while not seq.done:
        clock = time.perf_counter()
        ids = seq.ids
        room = request.max_new_tokens - len(seq.tokens) - 1  # drafts that can still become tokens
        drafts, q = drafter.propose(ids, min(k, room), options, seq.rng) if k and room > 0 else ([], None)
        proposed, start = len(drafts), cache.length
        logits = forward_cached(gpt, [*ids[start:], *drafts], cache, logits_to_keep=len(drafts) + 1)
        # [n+1, vocab]: the rows after ids, after d1, ..., after dn (the first step feeds the prompt too)
        if not np.isfinite(logits).all():
            if drafts:  # a draft overflowed the model, and its page's rows with it: a plain step
                cache.truncate(start)  # instead, as plain decoding never feeds it
                drafts, q = [], None
                logits = forward_cached(gpt, ids[start:], cache, logits_to_keep=1)
            check_finite(logits)
        n_accepted = verify(seq, logits, drafts, q, time.perf_counter() - clock)
        cache.truncate(len(ids) + n_accepted)  # keep the accepted drafts' keys, drop the rejected ones
        drafter.accepted(len(ids) + n_accepted)
        counts.drafted += proposed
        counts.accepted += n_accepted
        if proposed:  # adapt k: +2 after a full acceptance, -1 after a rejection (0: plain steps)
            if n_accepted == proposed:
                k, wait = min(draft_tokens, k + 2), 1
            else:
                k -= 1
                if k == 0 and proposed == 1:
                    wait = min(2 * wait, MAX_WAIT)  # a failed single-draft try: wait longer before the next
            idle = 0
        elif k == 0:
            idle += 1
            if idle >= wait:
                k = 1  # try one draft again
        yield
