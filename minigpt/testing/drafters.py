"""check_drafter: the drafter contract (minigpt.engine.drafters) as properties, for a drafter of
one's own: every proposal passes check_proposal's rules, and greedy speculative decoding with it
gives bitwise plain greedy decoding's tokens and log-probabilities, whatever logits processing.
"""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ..engine.drafters import Drafter, check_proposal
from ..errors import DrafterError
from ..loading.model import Model
from ..loop.sampling import SamplingOptions
from ..api.api import generate
from .bits import assert_bitwise
from .strategies import controls, sampling, token_ids


def check_drafter(drafter: Drafter, model: Model, max_examples: int = 50) -> None:
    """Return quietly if `drafter` keeps the contract with `model` (a drafter for its vocabulary);
    else raise an AssertionError naming the breach, with Hypothesis' falsifying example in its notes.
    Each example starts a sequence afresh (`accepted(0)`), as every generate call does."""
    run = settings(max_examples=max_examples, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    config = model.config

    @run
    @given(data=st.data())
    def every_proposal_keeps_the_contract(data):
        ids = data.draw(token_ids(config, max_size=config.n_positions - 1), label="context")
        k = data.draw(st.integers(1, min(8, config.n_positions - len(ids))), label="k")  # room for k drafts
        options = data.draw(sampling, label="sampling")
        rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="rng seed"))
        drafter.accepted(0)
        try:
            check_proposal(drafter, drafter.propose(ids, k, SamplingOptions(**options), rng), k, config.vocab_size)
        except DrafterError as e:
            raise AssertionError(str(e)) from None

    @run
    @given(data=st.data())
    def greedy_speculation_is_bitwise_plain_greedy(data):
        ids = data.draw(token_ids(config, max_size=config.n_positions), label="prompt")
        n = data.draw(st.integers(1, config.n_positions - len(ids) + 1), label="max_new_tokens")
        k = data.draw(st.integers(1, 8), label="draft_tokens")
        options = data.draw(controls(config.vocab_size, n))
        plain = generate(model, ids, n, **options)
        drafter.accepted(0)
        try:
            spec = generate(model, ids, n, speculate=drafter, draft_tokens=k, **options)
        except DrafterError as e:
            raise AssertionError(str(e)) from None
        assert_bitwise(spec, plain, "speculative greedy vs plain greedy")

    every_proposal_keeps_the_contract()
    greedy_speculation_is_bitwise_plain_greedy()
