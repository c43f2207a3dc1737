"""Speculative decoding is exact: greedy speculative tokens are plain greedy tokens, and the logits
behind every token are bitwise those plain decoding computes, whatever the drafter guesses and
whatever logits processing the request asks for (the penalties count exactly the tokens kept)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from minigpt.testing.strategies import controls, models, token_ids

from minigpt.api.api import generate
from minigpt.loading.model import Model


class RandomDrafter:
    """Proposes random tokens: almost always wrong, never harmful."""

    def __init__(self, vocab_size: int, seed: int):
        self.vocab_size, self.rng = vocab_size, np.random.default_rng(seed)

    def propose(self, ids, k, options, rng):
        return self.rng.integers(self.vocab_size, size=k).tolist(), None

    def accepted(self, n_positions):
        pass


def recording(model: Model, rows: list) -> Model:
    """The model, recording every row of logits its LM head computes (the linear whose weight is wte)."""
    def linear(x, weight, bias):
        y = model.kernels.linear(x, weight, bias)
        if weight is model.params.wte:
            rows.extend(y)
        return y

    return Model(model.config, model.params, dataclasses.replace(model.kernels, linear=linear))


drafters = st.sampled_from(["ngram", "self", "random"])


@given(st.data())
def test_speculative_greedy_tokens_and_logits_are_bitwise_plain_greedy(data):
    """With prompt lookup, the model as its own draft (without controls every draft accepted, up to
    an end-of-text) or a drafter of random tokens, any k, with or without logit_bias, penalties and
    min_tokens: the greedy tokens equal plain greedy decoding's, and the logits row behind each
    token is bitwise the row plain decoding computed for it."""
    model = data.draw(models(min_positions=2))
    ids = data.draw(token_ids(model.config, max_size=model.config.n_positions))
    n = data.draw(st.integers(1, model.config.n_positions - len(ids) + 1), label="max_new_tokens")  # the whole context
    k = data.draw(st.integers(1, 8), label="draft_tokens")
    kind = data.draw(drafters, label="drafter")
    stop_at_eos = data.draw(st.booleans(), label="stop_at_eos")
    options = data.draw(controls(model.config.vocab_size, n))
    plain_rows, spec_rows = [], []
    plain = generate(recording(model, plain_rows), ids, n, stop_at_eos=stop_at_eos, **options)
    target = recording(model, spec_rows)
    speculate = {"ngram": "ngram", "self": model,
                 "random": RandomDrafter(model.config.vocab_size, data.draw(st.integers(0, 99)))}[kind]
    spec = generate(target, ids, n, speculate=speculate, draft_tokens=k, stop_at_eos=stop_at_eos, **options)
    assert spec.tokens == plain.tokens
    assert spec.logprobs == plain.logprobs
    by_bits = {row.tobytes() for row in spec_rows}
    assert all(row.tobytes() in by_bits for row in plain_rows[-len(plain.tokens):] if plain.tokens)
    if kind == "self" and not options:  # its own draft is always right: only drafts after an end-of-text go unused
        assert spec.accepted == spec.drafted or (spec.finish_reason == "eos" and spec.drafted - spec.accepted < k)

