"""Row independence, bit for bit: a position's numbers depend on its own and earlier tokens only,
never on how many positions are computed with it or on anything that comes after it."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from minigpt.testing import assert_bitwise
from minigpt.testing.strategies import models, token_ids

from minigpt.exact.causal_proof import record_forward


@given(st.data())
def test_prefix_invariance_forward_of_a_prefix_is_bitwise_the_first_rows_of_the_full_forward(data):
    """forward(ids[:n]) equals the first n rows of forward(ids), bitwise, for every layer's hidden
    states (embeddings, each block, ln_f), every layer's K and V, and the logits."""
    model = data.draw(models())
    ids = data.draw(token_ids(model.config))
    n = data.draw(st.integers(1, len(ids)), label="n")
    assert_bitwise({key: rows[:n] for key, rows in record_forward(model, ids).items()}, record_forward(model, ids[:n]),
                   "recorded forward")


@given(st.data())
def test_causality_changing_tokens_at_positions_from_n_on_leaves_earlier_positions_bitwise_unchanged(data):
    """Replacing any tokens at positions >= n leaves every hidden state, K, V and logit of the
    positions < n bitwise unchanged."""
    model = data.draw(models(min_positions=2))
    ids = data.draw(token_ids(model.config, min_size=2))
    n = data.draw(st.integers(1, len(ids) - 1), label="n")
    tail = len(ids) - n
    changed = ids[:n] + data.draw(token_ids(model.config, tail, tail).filter(lambda t: t != ids[n:]), label="new tail")
    before_n = {key: a[:n] for key, a in record_forward(model, ids).items()}
    assert_bitwise({key: rows[:n] for key, rows in record_forward(model, changed).items()}, before_n, "recorded forward")
