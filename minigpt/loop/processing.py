"""Logits processing: what a request does to the model's logits before its next token is chosen.

A `Processing` (a bias, penalties, `min_tokens`, a grammar's mask) is declared once per request and
starts one `Processor` per sequence. Two rules keep it exact: a row is processed only once every
token before it is kept (nothing to roll back), and only what chooses the token is processed, never
the log-probabilities reported (docs/logits-processing.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np


class Processor(Protocol):
    """One sequence's logits processing, with the state it keeps."""

    def apply(self, z: np.ndarray) -> None:
        """Process z, float64 [vocab], in place."""
        ...

    def advance(self, token: int) -> None:
        """The sequence kept `token`."""
        ...

    @property
    def complete(self) -> bool:
        """Nothing may follow but the end (a grammar matched whole): the sequence stops."""
        ...


class Processing(Protocol):
    """A request's logits processing as it was asked for, shared by every sequence of the request."""

    def start(self, prompt: tuple[int, ...]) -> Processor:
        """A new sequence's processor, after its prompt."""
        ...


@dataclass(frozen=True)
class Penalties:
    """OpenAI's logit_bias, presence and frequency penalties and the repetition penalty, applied in
    vLLM's order: the bias, the repetition penalty, then the other two (formulas in
    docs/logits-processing.md)."""

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
