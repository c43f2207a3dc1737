"""The exact kernels' cut of the weights changes no bit: whatever block sizes and row-count switch
a machine's tuning chooses, every product and every forward is bitwise the same."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from minigpt.testing import assert_bitwise
from minigpt.testing.strategies import models, token_ids

from minigpt.gpt2.forward import forward
from minigpt.exact.linear import exact_linear
from minigpt.exact.tuning import tuned
from minigpt.exact.tuning import Tuning

tunings = st.builds(Tuning, one_row_block=st.integers(1, 2**23), multi_row_block=st.integers(1, 2**22),
                    shared_block=st.integers(1, 2**21), shared_rows=st.integers(1, 20), gemm_rows=st.integers(1, 20))


@given(tunings, tunings, st.integers(1, 40), st.integers(1, 300), st.integers(1, 700), st.integers(0, 2**32 - 1),
       st.booleans())
def test_tuning_invariance_exact_linear_is_bitwise_the_same_under_any_two_tunings(a, b, rows, n_in, n_out, seed,
                                                                                  head):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, n_in), dtype=np.float32)
    # a checkpoint's [n_in, n_out] (gemv "N"), or the head's wte.T, a view of [n_out, n_in] (gemv "T")
    w = rng.standard_normal((n_out, n_in), dtype=np.float32).T if head else \
        rng.standard_normal((n_in, n_out), dtype=np.float32)
    with tuned(a):
        ya = exact_linear(x, w, None)
    with tuned(b):
        yb = exact_linear(x, w, None)
    assert_bitwise(ya, yb, f"{a} vs {b}")


@given(st.data(), tunings, tunings)
def test_tuning_invariance_a_forward_is_bitwise_the_same_under_any_two_tunings(data, a, b):
    model = data.draw(models())
    ids = data.draw(token_ids(model.config))
    with tuned(a):
        la = forward(model, ids)
    with tuned(b):
        lb = forward(model, ids)
    assert_bitwise(la, lb, f"{a} vs {b}")
