"""The operations against references that cannot share their bugs: GELU, LayerNorm and softmax
within a few float32 roundings of their float64 formulas, log-probabilities within a fraction of a
float32 rounding of an exact (math.fsum) normaliser, and temperature, top-k and top-p keeping
exactly the tokens, with the same probabilities, that transformers' warper chain keeps."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from minigpt.gpt2.layers import attention_weights, gelu, layer_norm
from minigpt.gpt2.params import LayerNorm
from minigpt.loop.sampling import SamplingOptions, filtered_log_probs, log_softmax

EPS32 = float(np.finfo(np.float32).eps)  # 2**-23
seeds = st.integers(0, 2**32 - 1)
scales = st.sampled_from([1e-3, 0.1, 1.0, 10.0, 1e3, 1e5])


@given(seed=seeds, scale=scales)
def test_gelu_is_within_4_float32_ulps_of_x_of_the_float64_tanh_formula(seed, scale):
    """Over a wide range of x (and a grid through the bend near 0): |gelu(x) - ref(x)| <= 4 ulp(x)."""
    rng = np.random.default_rng(seed)
    x = np.concatenate([rng.standard_normal(4096) * scale, np.linspace(-8, 8, 4097)]).astype(np.float32)
    y = gelu(x)
    xd = x.astype(np.float64)
    reference = 0.5 * xd * (1 + np.tanh(math.sqrt(2 / math.pi) * (xd + 0.044715 * xd**3)))
    ulps = np.abs(y - reference) / np.spacing(np.maximum(np.abs(x), np.finfo(np.float32).tiny)).astype(np.float64)
    assert y.dtype == np.float32 and ulps.max() <= 4, ulps.max()


@given(seed=seeds, scale=scales, offset=st.sampled_from([0.0, 3.0, 30.0]))
def test_layer_norm_is_within_4_float32_roundings_of_the_float64_formula(seed, scale, offset):
    """Rows of any scale, their mean up to 30 standard deviations from 0: each output within 4
    units of eps32 * (|g| (|n| + 1 + |mean| / std) + |b|), n the float64 normalised value (the
    float32 mean's rounding, amplified by the distance of the mean from 0, is the algorithm's own)."""
    rng = np.random.default_rng(seed)
    C = 96
    x = (rng.standard_normal((8, C)) * scale + rng.standard_normal((8, 1)) * scale * offset).astype(np.float32)
    g, b = rng.standard_normal(C).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    y = layer_norm(x, LayerNorm(g, b), 1e-5)
    xd = x.astype(np.float64)
    mean = xd.mean(-1, keepdims=True)
    std = np.sqrt(((xd - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
    n = (xd - mean) / std
    bound = EPS32 * (np.abs(g) * (np.abs(n) + 1 + np.abs(mean) / std) + np.abs(b))
    assert y.dtype == np.float32 and (np.abs(y - (n * g + b)) / bound).max() <= 4


@given(seed=seeds, scale=st.sampled_from([0.1, 1.0, 3.0, 30.0]))
def test_attention_softmax_is_within_8_float32_roundings_of_the_float64_formula(seed, scale):
    """Causal softmax weights of queries over keys: each within 8 units of eps32 * w * (1 + the
    scores' magnitude |q| . |k| / sqrt(hd)), the float32 scores' own rounding; the future exactly 0."""
    rng = np.random.default_rng(seed)
    H, T, L, hd = 3, 9, 21, 16
    q = (rng.standard_normal((H, T, hd)) * scale).astype(np.float32)
    k = (rng.standard_normal((H, L, hd)) * scale).astype(np.float32)
    w = attention_weights(q, k)
    qd, kd = q.astype(np.float64), k.astype(np.float64)
    scores = qd @ kd.transpose(0, 2, 1) / math.sqrt(hd)
    future = np.arange(L)[None, :] > np.arange(L - T, L)[:, None]
    scores[:, future] = -np.inf
    reference = np.exp(scores - scores.max(-1, keepdims=True))
    reference /= reference.sum(-1, keepdims=True)
    magnitude = np.abs(qd) @ np.abs(kd).transpose(0, 2, 1) / math.sqrt(hd)
    bound = EPS32 * reference * (1 + magnitude) + np.finfo(np.float32).tiny
    assert w.dtype == np.float32 and not w[:, future].any()
    assert (np.abs(w - reference) / bound)[:, ~future].max() <= 8


@given(seed=seeds, scale=st.sampled_from([1.0, 5.0, 30.0]))
def test_log_probabilities_are_within_half_a_float32_rounding_of_an_exact_fsum_reference(seed, scale):
    """A full GPT-2 vocabulary of float32 logits: log_softmax's every entry within eps32 / 2 of the
    logit minus log(math.fsum(exp(logits))) in float64 (a float32 sum of 50,257 terms is not)."""
    logits = (np.random.default_rng(seed).standard_normal(50257) * scale).astype(np.float32)
    top = float(logits.max())
    exact = top + math.log(math.fsum(math.exp(float(v) - top) for v in logits))
    assert np.abs(log_softmax(logits) - (logits.astype(np.float64) - exact)).max() <= EPS32 / 2


@given(seed=seeds, scale=st.sampled_from([0.5, 2.0, 8.0]), temperature=st.floats(0.05, 3.0),
       top_k=st.none() | st.integers(1, 300), top_p=st.none() | st.floats(0.05, 1.0))
def test_temperature_top_k_and_top_p_keep_exactly_the_tokens_transformers_keeps_with_its_probabilities(
        seed, scale, temperature, top_k, top_p):
    """transformers' chain TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper, as its
    generate applies it, and filtered_log_probs: the same tokens kept, the same probabilities."""
    torch = pytest.importorskip("torch", reason="torch (the `parity` extra) is the reference warper chain's")
    warpers = pytest.importorskip("transformers.generation.logits_process",
                                  reason="transformers (the `parity` extra) holds the reference warper chain")
    logits = (np.random.default_rng(seed).standard_normal(1000) * scale).astype(np.float32)
    scores = torch.from_numpy(logits.astype(np.float64))[None]
    chain = [warpers.TemperatureLogitsWarper(temperature)]
    chain += [warpers.TopKLogitsWarper(top_k)] if top_k is not None else []
    chain += [warpers.TopPLogitsWarper(top_p)] if top_p is not None and top_p < 1 else []
    for warper in chain:
        scores = warper(None, scores)
    theirs = torch.softmax(scores, -1)[0].numpy()
    if top_p is not None and top_p < 1:  # a cumulative mass within rounding of top_p: either set is right
        kept = np.exp(filtered_log_probs(logits, SamplingOptions(temperature, top_k, None, None)))
        assume(np.abs(np.cumsum(np.sort(kept)[::-1]) - top_p).min() > 1e-9)
    ours = np.exp(filtered_log_probs(logits, SamplingOptions(temperature, top_k, top_p, None)))
    assert np.array_equal(theirs > 0, ours > 0)
    np.testing.assert_allclose(ours, theirs, rtol=1e-9, atol=1e-12)
