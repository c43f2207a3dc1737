"""Attention weights, as both kernel sets compute them: each query's row is a probability
distribution over the keys it may see, and every weight on a future key is exactly +0.0."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from minigpt.testing.strategies import chunkings, models, token_ids

from minigpt.exact.kernels import EXACT, FAST
from minigpt.exact.tracing import traced_forward

EPS = float(np.finfo(np.float32).eps)  # 2**-23


@pytest.mark.parametrize("kernels", [EXACT, FAST], ids=lambda k: k.name)
@given(data=st.data())
def test_attention_rows_are_probability_distributions_and_masked_weights_are_exactly_zero(kernels, data):
    """For every layer, head and query t (fed whole or in chunks through a cache): the weights on
    keys > t are +0.0 bit for bit; the others lie in [0, 1], are not all 0, and sum to 1 within
    S * eps (S keys; float32 eps = 2**-23)."""
    model = data.draw(models(kernels))
    ids = data.draw(token_ids(model.config))
    cache, start = model.new_cache(len(ids)), 0
    for size in data.draw(chunkings(len(ids)), label="chunks"):
        for weights in traced_forward(model, ids[start:start + size], cache).weights:  # [H, T, S], S = start + T
            assert weights.dtype == np.float32
            S = weights.shape[2]
            future = np.arange(S) > (start + np.arange(size))[:, None]  # [T, S]
            assert not weights.view(np.uint32)[:, future].any(), "a weight on a future key is not +0.0"
            seen = np.where(future, np.float32(0.0), weights).astype(np.float64)
            assert ((seen >= 0) & (seen <= 1)).all()
            assert (seen.max(axis=-1) > 0).all()
            np.testing.assert_allclose(seen.sum(axis=-1), 1.0, rtol=0, atol=S * EPS)
        start += size
