"""The forward pass and its cache: shapes, dtypes, and the API's promises."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import minigpt
from minigpt.gpt2.config import GPT2Config
from minigpt.errors import ContextLengthError, InputError
from minigpt.exact.kernels import FAST
from minigpt.loading.model import Model
from minigpt.exact.tracing import traced_forward
from minigpt.loading.weights import params_to_tensors
from minigpt.loading.weights import random_params

CONFIG = GPT2Config(vocab_size=97, n_positions=40, n_embd=24, n_layer=2, n_head=3, eos_token_id=96)


@pytest.fixture(scope="module")
def model():
    return Model(CONFIG, random_params(CONFIG, seed=1, scale=3.0))


def ids(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, CONFIG.vocab_size, n)


def test_forward_returns_float32_logits_for_every_position(model):
    logits = model.forward(ids(11))
    assert logits.shape == (11, CONFIG.vocab_size) and logits.dtype == np.float32


def test_logits_to_keep_computes_the_lm_head_for_the_last_rows_only(model):
    x = ids(9)
    np.testing.assert_array_equal(model.forward(x, logits_to_keep=1), model.forward(x)[-1:])
    np.testing.assert_array_equal(model.forward(x, logits_to_keep=4), model.forward(x)[-4:])
    assert model.forward(x, logits_to_keep=20).shape == (9, CONFIG.vocab_size)  # more than there are: all
    with pytest.raises(InputError, match="logits_to_keep must be an integer >= 0"):
        model.forward(x, logits_to_keep=-1)


def test_new_cache_is_preallocated_for_the_whole_context(model):
    cache = model.new_cache()
    assert cache.length == 0
    assert cache.capacity == CONFIG.n_positions
    assert cache.k.shape == (CONFIG.n_layer, CONFIG.n_head, cache.capacity, CONFIG.head_dim)
    assert cache.k.dtype == cache.v.dtype == np.float32


def test_forward_with_a_cache_appends_and_continues_in_place(model):
    x = ids(20)
    cache = model.new_cache()
    k_buffer = cache.k
    first = model.forward(x[:12], cache=cache)
    assert cache.length == 12 and cache.k is k_buffer  # no reallocation, no concatenation
    rest = model.forward(x[12:], cache=cache)
    assert cache.length == 20
    np.testing.assert_array_equal(np.concatenate([first, rest]), model.forward(x))


def test_a_truncated_or_copied_cache_continues_bitwise_as_a_fresh_one(model):
    """A prefix continued two ways: truncate back to it, or fork with copy.deepcopy (docs/api.md). Each
    continuation's logits are bitwise those of a cache that only ever held the prefix."""
    prefix, a, b = ids(20, 1), ids(5, 2), ids(7, 3)
    fresh = {}
    for name, continuation in (("a", a), ("b", b)):
        cache = model.new_cache()
        model.forward(prefix, cache)
        fresh[name] = model.forward(continuation, cache)
    cache = model.new_cache()
    model.forward(prefix, cache)
    fork = copy.deepcopy(cache)
    assert model.forward(a, cache).tobytes() == fresh["a"].tobytes()
    assert model.forward(b, fork).tobytes() == fresh["b"].tobytes()
    cache.truncate(len(prefix))
    assert model.forward(b, cache).tobytes() == fresh["b"].tobytes()


def test_the_cache_holds_the_keys_the_naive_pass_computes(model):
    x = ids(13)
    cache = model.new_cache()
    model.forward(x, cache=cache)
    naive = model.new_cache(len(x))
    model.forward(x, cache=naive)
    np.testing.assert_array_equal(cache.k[:, :, :13], naive.k[:, :, :13])
    np.testing.assert_array_equal(cache.v[:, :, :13], naive.v[:, :, :13])


def test_a_traced_forward_records_every_hidden_state_and_attention_map_and_computes_the_forwards_logits(model):
    trace = traced_forward(model, ids(6))
    assert len(trace.hidden) == CONFIG.n_layer + 2  # embeddings, each block, final LayerNorm
    assert all(h.shape == (6, CONFIG.n_embd) and h.dtype == np.float32 for h in trace.hidden)
    assert [a.shape for a in trace.weights] == [(CONFIG.n_head, 6, 6)] * CONFIG.n_layer
    assert np.array_equal(trace.logits.view(np.uint32), model.forward(ids(6)).view(np.uint32))


def test_overflowing_the_context_is_refused_and_leaves_the_cache_as_it_was(model):
    cache = model.new_cache()
    model.forward(ids(30), cache=cache)
    with pytest.raises(ContextLengthError, match="40"):
        model.forward(ids(11), cache=cache)
    assert cache.length == 30


def test_empty_input_is_refused(model):
    with pytest.raises(InputError, match="at least one"):
        model.forward([])


def test_fast_kernels_agree_with_exact_to_float32_precision(model):
    fast = Model(CONFIG, model.params, kernels=FAST)
    x = ids(25)
    a, b = model.forward(x), fast.forward(x)
    assert np.abs(a - b).max() <= 1e-5 * np.abs(a).max()


def test_embedded_random_124m_has_gpt2_small_shapes(tokenizer):
    m = minigpt.load("random-124m")
    assert (m.config.n_layer, m.config.n_embd, m.config.n_head, m.config.vocab_size) == (12, 768, 12, 50257)
    assert sum(a.size for a in params_to_tensors(m.params).values()) == 124_439_808
    assert m.tokenizer.encode("The dog") == [464, 3290]


def test_a_cache_smaller_than_the_context_names_its_capacity(model):
    cache = model.new_cache(16)
    model.forward(ids(16), cache=cache)
    with pytest.raises(ContextLengthError, match="capacity of 16"):
        model.forward(ids(1), cache=cache)


def test_models_compare_by_identity_and_hash(model):
    other = Model(CONFIG, model.params)
    assert model == model and model != other  # no elementwise array comparison, no error
    assert len({model, other}) == 2
