"""Logits processing does what its formulas say and changes no report: greedy tokens with logit_bias,
the presence, frequency and repetition penalties and min_tokens are those of a reference loop that
applies OpenAI's, Hugging Face's and vLLM's formulas to model.forward's logits; and whatever the
controls and the sampling, the log-probabilities reported are the raw rows' (bitwise `score`'s).
Alone = in a batch = prefix cached = preempted is in test_batch_exactness.py and
test_prefix_cache_exactness.py, whose requests carry controls too; speculation is in
test_speculative_exactness.py."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from minigpt.testing.strategies import controls, models, sampling, token_ids

from minigpt.loop.sampling import token_log_prob
from minigpt.api.api import generate, score
from minigpt.requests.request import OPTIONS


def reference(model, prompt: list[int], n: int, stop_at_eos: bool, options: dict) -> tuple[list[int], list[float]]:
    """Greedy decoding written from the formulas, one model.forward over the whole sequence per token."""
    o = {name: options.get(name, OPTIONS[name].default) for name in OPTIONS}
    V, eos = model.config.vocab_size, model.config.eos_token_id if stop_at_eos else None
    bias = np.zeros(V)
    bias[list(o["logit_bias"] or {})] = list((o["logit_bias"] or {}).values())
    tokens, logprobs = [], []
    while len(tokens) < n and (not tokens or tokens[-1] != eos):
        raw = model.forward(prompt + tokens)[-1]  # float32 [V]
        z = raw.astype(np.float64) + bias  # OpenAI's logit_bias
        seen = np.isin(np.arange(V), prompt + tokens)  # HF's and vLLM's repetition penalty: prompt and new tokens
        r = o["repetition_penalty"]
        z = np.where(seen, np.where(z > 0, z / r, z * r), z)
        c = np.bincount(tokens, minlength=V)  # OpenAI's presence and frequency penalties: new tokens only
        z = np.where(c > 0, z - o["frequency_penalty"] * c - o["presence_penalty"], z)
        if eos is not None and len(tokens) < o["min_tokens"]:  # vLLM's min_tokens
            z[eos] = -np.inf
        tokens.append(int(np.argmax(z)))
        logprobs.append(token_log_prob(raw, tokens[-1]))
    return tokens, logprobs


@st.composite
def penalised(draw, vocab_size: int, max_new_tokens: int) -> dict:
    """Every penalty, and maybe logit_bias and min_tokens (controls, always some)."""
    bias = st.dictionaries(st.integers(0, vocab_size - 1), st.floats(-100, 100), max_size=4)
    return draw(st.fixed_dictionaries(
        {"presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
         "repetition_penalty": st.floats(0.1, 4)},
        optional={"logit_bias": bias, "min_tokens": st.integers(0, max_new_tokens)}), label="controls")


@given(st.data())
def test_greedy_tokens_with_controls_equal_a_reference_loop_applying_the_formulas_to_model_forward(data):
    """For any random model, prompt, penalties, logit_bias and min_tokens: greedy `generate` (the
    cached loop) gives the reference loop's tokens, each with the raw row's log-probability."""
    model = data.draw(models(min_positions=3))
    prompt = data.draw(token_ids(model.config, max_size=model.config.n_positions - 2))
    n = data.draw(st.integers(2, model.config.n_positions - len(prompt) + 1), label="max_new_tokens")
    options = data.draw(penalised(model.config.vocab_size, n))
    stop_at_eos = data.draw(st.booleans(), label="stop_at_eos")
    result = generate(model, prompt, n, stop_at_eos=stop_at_eos, **options)
    assert (result.tokens, result.logprobs) == reference(model, prompt, n, stop_at_eos, options)


@given(st.data())
def test_reported_log_probabilities_are_the_raw_rows_bitwise_score_s_whatever_the_controls(data):
    """Greedy or sampled, with any controls: each token's log-probability is score's for it, the
    model's own distribution, never the processed one the token was drawn from."""
    model = data.draw(models(min_positions=2))
    prompt = data.draw(token_ids(model.config, max_size=model.config.n_positions - 1))
    n = data.draw(st.integers(1, model.config.n_positions - len(prompt)), label="max_new_tokens")
    options = {**data.draw(sampling, label="sampling"), **data.draw(controls(model.config.vocab_size, n))}
    result = generate(model, prompt, n, stop_at_eos=False, **options)
    assert result.logprobs == score(model, prompt + result.tokens)[len(prompt) - 1:].tolist()
