"""Logits processing: what a request does to the model's logits before its next token is chosen
(docs/logits-processing.md).

The model gives raw logits. A request may reshape them first: a bias per token (`logit_bias`),
penalties on the tokens it has already seen (presence, frequency, repetition), a ban on ending too
early (`min_tokens`), a mask of the tokens a grammar forbids (structured outputs). Each is a
`Processing`, declared once per request, which starts one `Processor` per sequence: the state
that follows that sequence's tokens (counts, a grammar's position).

The seam, the whole interface a processing implements:

    class Processing(Protocol):   # what a request asks for: frozen, shared by all its sequences
        def start(self, prompt: tuple[int, ...]) -> Processor
    class Processor(Protocol):    # one sequence's state
        def apply(self, z: np.ndarray) -> None   # z: float64 [vocab], changed in place
        def advance(self, token: int) -> None    # the sequence kept `token`
        complete: bool                            # nothing may follow: the sequence ends ("stop")

`Sequence` (minigpt.loop.sequence) owns the processors. `Sequence.processed(logits)` copies a row
of raw logits to float64 and hands it to each processor in the request's order (masks come last,
so nothing after a mask can lift a token it forbids); `Sequence.append` calls `advance` with every
token it keeps. Every loop chooses through the sequence, so every loop processes alike, and the
loops keep two rules that make processing exact:

- A row is processed only once every token before it is kept: a processor never sees a token that
  is taken back, so it has nothing to roll back.
- Processing is applied to what chooses the token only. The log-probabilities a sequence reports
  are the raw row's (vLLM's default): a bias, a penalty or a mask never changes them.

Part 7's loops keep them too (speculative decoding, preemption, the prefix cache), so that with the
exact kernels a processed request gets the same tokens there as alone (docs/logits-processing.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Processor(Protocol):
    """One sequence's logits processing, with the state it keeps."""

    def apply(self, z: np.ndarray) -> None:
        """Process z, float64 [vocab] (the raw row, processed by the processings before this one), in place."""
        ...

    def advance(self, token: int) -> None:
        """The sequence kept `token`: the next row z comes after it."""
        ...

    @property
    def complete(self) -> bool:
        """Nothing may follow but the end (a grammar matched whole): the sequence ends there, "stop"."""
        ...


class Processing(Protocol):
    """A request's logits processing as it was asked for, shared by every sequence of the request."""

    def start(self, prompt: tuple[int, ...]) -> Processor:
        """A new sequence's processor, the prompt (as fed) before its first new token."""
        ...


@dataclass(frozen=True)
class Penalties:
    """OpenAI's logit_bias, presence and frequency penalties and Hugging Face's and vLLM's repetition
    penalty, applied in vLLM's order: the bias, then the repetition penalty, then the other two.

    - bias: z[j] += bias[j] for each listed token.
    - repetition: for each token of the prompt or of the new tokens, z[j] / repetition if z[j] > 0,
      else z[j] * repetition (1 changes nothing).
    - frequency, presence (OpenAI's formula): z[j] -= frequency * c[j] + presence * (c[j] > 0), with
      c[j] the count of j among the new tokens, computed as z[j] - frequency * c[j] - presence.
    """

    bias_ids: tuple[int, ...] = ()  # distinct token ids
    bias: tuple[float, ...] = ()  # their biases
    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0

    def start(self, prompt: tuple[int, ...]) -> PenaltyState:
        return PenaltyState(self, prompt)


class PenaltyState:
    """One sequence's counts: of each new token, and the set of tokens seen (prompt and new)."""

    complete = False  # penalties never end a sequence

    def __init__(self, penalties: Penalties, prompt: tuple[int, ...]):
        self.penalties = penalties
        self.bias_ids, self.bias = np.array(penalties.bias_ids, np.int64), np.array(penalties.bias, np.float64)
        self.seen_set = set(prompt)
        self.seen = np.array(sorted(self.seen_set), np.int64)  # [distinct tokens seen], for the repetition penalty
        self.counted: dict[int, int] = {}  # new token -> its place in counts
        self.ids: list[int] = []  # the distinct new tokens, in order of first appearance
        self.counts: list[int] = []  # how often each came

    def apply(self, z: np.ndarray) -> None:
        p = self.penalties
        if self.bias_ids.size:
            z[self.bias_ids] += self.bias
        if p.repetition != 1:
            seen = z[self.seen]
            z[self.seen] = np.where(seen > 0, seen / p.repetition, seen * p.repetition)
        if self.ids and (p.frequency or p.presence):
            ids = np.array(self.ids, np.int64)
            z[ids] = z[ids] - p.frequency * np.array(self.counts, np.float64) - p.presence

    def advance(self, token: int) -> None:
        place = self.counted.get(token)
        if place is None:
            self.counted[token] = len(self.ids)
            self.ids.append(token)
            self.counts.append(1)
            if token not in self.seen_set:
                self.seen_set.add(token)
                self.seen = np.append(self.seen, token)
        else:
            self.counts[place] += 1
