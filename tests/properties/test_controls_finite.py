"""Every value the controls' checks accept keeps sampling finite: whatever finite float32 logits the
forward gives, the bias, the penalties, min_tokens, temperature, top-k and top-p that check_options
lets through leave a row with no NaN and no +infinity, some token that can be chosen, and a
distribution that sums to 1. The values are drawn at and beyond every documented bound, so a bound
that lets an overflowing value through (a tiny repetition penalty dividing a large logit) fails here."""

from __future__ import annotations

import sys

import numpy as np
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minigpt.errors import InputError
from minigpt.requests.request import MAX_BIAS, MAX_PENALTY, MAX_REPETITION_PENALTY, MIN_REPETITION_PENALTY, check_options
from minigpt.requests.request import processing
from minigpt.loop.sampling import SamplingOptions
from minigpt.loop.sequence import Request, Sequence

BIG = sys.float_info.max
floats32 = st.floats(width=32, allow_nan=False, allow_infinity=False)  # any finite float32, +-3.4e38 included


def within(low: float, high: float) -> st.SearchStrategy[float]:
    """Floats in [low, high], the bounds themselves often."""
    return st.sampled_from([low, high]) | st.floats(low, high)


@given(st.data())
def test_sampling_stays_finite_for_every_value_the_controls_checks_accept(data):
    V = data.draw(st.integers(2, 12), label="vocab")
    logits = data.draw(hnp.arrays(np.float32, V, elements=floats32), label="logits")  # [V]
    prompt = data.draw(st.lists(st.integers(0, V - 1), min_size=1, max_size=2 * V), label="prompt")
    eos = data.draw(st.none() | st.integers(0, V - 1), label="eos")
    new = data.draw(st.lists(st.integers(0, V - 1).filter(lambda t: t != eos), max_size=2 * V), label="new tokens")
    beyond = st.sampled_from([5e-324, 1e-300, 1e300, BIG])  # refused by the check (assume() drops them)
    bias = st.one_of(st.sampled_from([-MAX_BIAS, MAX_BIAS]), within(-MAX_BIAS, MAX_BIAS))
    values = {
        "max_new_tokens": len(new) + 1,
        "temperature": data.draw(st.sampled_from([0.0, 5e-324, BIG]) | st.floats(0, BIG), label="temperature"),
        "top_k": data.draw(st.none() | st.integers(1, V + 1), label="top_k"),
        "top_p": data.draw(st.none() | st.sampled_from([5e-324, 1.0]) | within(0, 1), label="top_p"),
        "logit_bias": data.draw(st.dictionaries(st.integers(0, V - 1), bias, max_size=V), label="logit_bias"),
        "presence_penalty": data.draw(within(-MAX_PENALTY, MAX_PENALTY), label="presence"),
        "frequency_penalty": data.draw(within(-MAX_PENALTY, MAX_PENALTY), label="frequency"),
        "repetition_penalty": data.draw(within(MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY) | beyond,
                                        label="repetition"),
        "min_tokens": data.draw(st.integers(0, len(new) + 1), label="min_tokens"),
    }
    try:
        checked = check_options(values)
    except InputError:
        assume(False)
    sampling = SamplingOptions(checked["temperature"], checked["top_k"], checked["top_p"], 0)
    seq = Sequence(Request(tuple(prompt), checked["max_new_tokens"], sampling, eos,
                           min_tokens=checked["min_tokens"], processing=processing(checked, None, eos)))
    for token in new:
        seq.append(token, logits, 0.0)
    z = seq.processed(logits)  # [V], what chooses the token
    assert not np.isnan(z).any() and not np.isposinf(z).any() and np.isfinite(z).any()
    token = seq.choose(logits)
    if not sampling.temperature:
        assert z[token] == z.max()
    if sampling.temperature:
        p = seq.probabilities(logits)  # [V], what the token was drawn from
        assert np.isfinite(p).all() and abs(p.sum() - 1) < 1e-9 and p[token] > 0
