"""The KV cache is exact: however the sequence is fed, chunk by chunk or all at once, cached or
recomputed every step, the numbers and the tokens are bitwise the same."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from minigpt.testing import assert_bitwise
from minigpt.testing.strategies import chunked_record, chunkings, controls, models, token_ids

from minigpt.cache.kv_cache import forward_cached, new_cache
from minigpt.exact.causal_proof import record_forward
from minigpt.gpt2.forward import forward
from minigpt.api.api import generate


@given(st.data())
def test_cache_exactness_chunked_prefill_then_single_token_decode_is_bitwise_the_full_forward(data):
    """Feeding ids in arbitrary prefill chunks and then one token at a time into one KV cache (of
    any capacity that fits) gives bitwise the full forward's logits, hidden states, K and V."""
    model = data.draw(models())
    ids = data.draw(token_ids(model.config))
    chunks = data.draw(chunkings(len(ids)), label="chunks")
    capacity = data.draw(st.integers(len(ids), model.config.n_positions), label="capacity")
    assert_bitwise({key: rows[:len(ids)] for key, rows in record_forward(model, ids).items()},
                   chunked_record(model, ids, chunks, capacity), "recorded forward")


sampling = st.one_of(
    st.just({}),  # greedy
    st.fixed_dictionaries({"temperature": st.floats(0.05, 3.0), "seed": st.integers(0, 2**32 - 1)},
                          optional={"top_k": st.integers(1, 64), "top_p": st.floats(0.05, 1.0)}),
)


@given(st.data())
def test_generation_equivalence_cached_and_naive_loops_generate_identical_tokens(data):
    """generate() with and without the KV cache returns the same tokens, greedy and with seeded
    sampling (temperature, top-k, top-p), with or without logit_bias, penalties and min_tokens,
    stopping at <|endoftext|> or not."""
    model = data.draw(models(min_positions=2))
    ids = data.draw(token_ids(model.config, max_size=model.config.n_positions))
    n = data.draw(st.integers(1, model.config.n_positions - len(ids) + 1), label="max_new_tokens")  # the whole context
    options = {**data.draw(sampling, label="sampling"), **data.draw(controls(model.config.vocab_size, n)),
               "stop_at_eos": data.draw(st.booleans(), label="stop_at_eos")}
    cached = generate(model, ids, n, use_cache=True, **options)
    naive = generate(model, ids, n, use_cache=False, **options)
    assert cached.tokens == naive.tokens


@given(st.data())
def test_forward_cached_in_any_chunks_is_bitwise_part_1_s_forward_and_appending_changes_no_old_row(data):
    """On the real forwards, not the traced one: gpt2.forward.forward's logits for ids are bitwise
    kv_cache.forward_cached's fed the same ids in any chunks (after a prefill, one token at a time);
    and forward over ids[:t] is bitwise the first t rows of forward over ids (an appended token
    changes no earlier position)."""
    model = data.draw(models())
    ids = data.draw(token_ids(model.config))
    whole = forward(model, ids)
    cache, rows, start = new_cache(model.config, len(ids)), [], 0
    for size in data.draw(chunkings(len(ids)), label="chunks"):
        rows.append(forward_cached(model, ids[start:start + size], cache))
        start += size
    assert_bitwise(np.concatenate(rows), whole, "chunked forward_cached vs forward")
    t = data.draw(st.integers(1, len(ids)), label="t")
    assert_bitwise(forward(model, ids[:t]), whole[:t], f"forward over the first {t} ids vs its rows")
