"""generate's log-probabilities are score's: the same rows of logits (exact kernels: a row does not
depend on how the sequence was fed) through the same function (sampling.token_log_prob)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from minigpt.testing.strategies import models, token_ids

from minigpt.api.api import generate
from minigpt.api.api import score


@given(st.data())
def test_generate_logprobs_are_bitwise_score_of_prompt_plus_tokens(data):
    """For any random tiny model, prompt and length, greedy or seeded sampling (with or without
    top-k / top-p), cached or naive: generate(...).logprobs == score(prompt_ids + tokens)[len(prompt_ids) - 1:],
    bit for bit."""
    model = data.draw(models(min_positions=2))
    ids = data.draw(token_ids(model.config, max_size=model.config.n_positions))
    n = data.draw(st.integers(1, model.config.n_positions - len(ids) + 1), label="max_new_tokens")  # the whole context
    sampling = data.draw(st.one_of(
        st.just({}),
        st.fixed_dictionaries({"temperature": st.sampled_from([0.5, 1.0, 3.0]), "seed": st.integers(0, 2**32 - 1),
                               "top_k": st.none() | st.integers(1, 8), "top_p": st.none() | st.just(0.9)})),
        label="sampling")
    result = generate(model, ids, n, use_cache=data.draw(st.booleans(), label="use_cache"), **sampling)
    if not result.tokens:
        return
    scored = score(model, result.prompt_ids + result.tokens)[len(result.prompt_ids) - 1:]
    assert scored.tobytes() == np.array(result.logprobs, dtype=np.float64).tobytes()
