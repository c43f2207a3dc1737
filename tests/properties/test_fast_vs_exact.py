"""The fast (plain BLAS) kernels are not bitwise exact, but they compute the same function: they
agree with the exact kernels to a stated float32 tolerance."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from minigpt.testing.strategies import chunked_record, chunkings, models, token_ids

from minigpt.exact.causal_proof import record_forward
from minigpt.exact.kernels import FAST

# Relative to each array's largest magnitude. A targeted Hypothesis search (1500 examples per
# scale) found at most 1.4e-6 at Hugging Face's initialisation (scale 1) and 1.4e-5 at 30x.
# At 1000x (std 20) attention scores reach ~1e5, where one ULP of a score is ~0.01 of an
# exponent: softmax is ill-conditioned there and the kernels differed by up to 2.3e-4, so this
# property leaves that scale out (docs/exactness.md).
RTOL = 1e-4


@given(st.data())
def test_fast_kernels_agree_with_exact_within_1e_4_of_each_arrays_scale(data):
    """For weights at scales 0, 1 and 30, every hidden state, K, V and logit of the fast kernels
    (full forward and chunked cached decode) is within RTOL * max|exact| of the exact kernels'."""
    model = data.draw(models(scales=(0.0, 1.0, 30.0)))
    ids = data.draw(token_ids(model.config))
    fast = dataclasses.replace(model, kernels=FAST)
    exact = record_forward(model, ids)
    chunks = data.draw(chunkings(len(ids)), label="chunks")
    for computed in (record_forward(fast, ids), chunked_record(fast, ids, chunks, len(ids))):
        for key, a in exact.items():
            np.testing.assert_allclose(computed[key], a, rtol=0, atol=RTOL * float(np.abs(a).max()), err_msg=str(key))
