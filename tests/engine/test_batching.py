"""generate_batch and its scheduler: options per prompt, checks before any work, preemption, and
pages that always come back to the pool."""

from __future__ import annotations

import re

import numpy as np
import pytest

import minigpt
import minigpt.api.api
from minigpt.engine.engine import Engine
from minigpt.api.api import generate_batch
from minigpt.requests.request import make_requests
from minigpt.errors import ContextLengthError, InputError
from minigpt.engine.paging import PAGE


def requests_and_pool(tiny_model, prompts, n, kv_cache_tokens, max_batch_size=3):
    options = dict(max_new_tokens=n, temperature=0.0, top_k=None, top_p=None, seed=None, stop=None,
                   stop_at_eos=False, top_logprobs=0)
    requests = make_requests(tiny_model, prompts, options)
    return requests, Engine(tiny_model, max_batch_size=max_batch_size, kv_cache_tokens=kv_cache_tokens)


def run(engine, requests, on_tokens=None):
    return engine.results(engine.jobs_for(requests), on_tokens)


def test_a_tight_pool_preempts_and_every_sequence_still_gets_its_tokens_alone(tiny_model):
    prompts = [list(range(i, i + 40)) for i in (0, 100, 200)]
    smallest = 112  # 40 + 60 - 1 = 99 positions: 7 pages of 16
    results = generate_batch(tiny_model, prompts, 60, stop_at_eos=False, kv_cache_tokens=smallest)
    assert results[0].preemptions == 0 and results[-1].preemptions > 0  # the newest goes first, as vLLM's
    for prompt, result in zip(prompts, results):
        alone = minigpt.generate(tiny_model, prompt, 60, stop_at_eos=False)
        assert result.tokens == alone.tokens and result.logprobs == alone.logprobs
        assert result.finish_reason == "length" and len(result.tokens) == 60


def test_options_per_prompt_and_results_in_prompt_order(tiny_model):
    prompts = [[5, 6, 7], [8], [9, 10]]
    results = generate_batch(tiny_model, prompts, [3, 5, 0], temperature=[0.0, 1.0, 0.5], seed=[None, 4, 2],
                             top_k=[None, 10, None], stop_at_eos=False, max_batch_size=2)
    assert [len(r.tokens) for r in results] == [3, 5, 0]
    assert [r.prompt_ids for r in results] == prompts
    assert results[2].finish_reason == "length" and results[2].tokens == []
    assert results[1].tokens == minigpt.generate(tiny_model, [8], 5, temperature=1.0, seed=4, top_k=10,
                                                 stop_at_eos=False).tokens


def test_an_int_seed_gives_each_prompt_the_generator_it_has_alone(tiny_model):
    prompts = [[1, 2], [1, 2]]
    a, b = generate_batch(tiny_model, prompts, 8, temperature=1.0, seed=7, stop_at_eos=False)
    alone = minigpt.generate(tiny_model, [1, 2], 8, temperature=1.0, seed=7, stop_at_eos=False)
    assert a.tokens == b.tokens == alone.tokens


@pytest.mark.parametrize("call, error, message", [
    (lambda m: generate_batch(m, [[1], [1, 99999]]), InputError, "prompt 1: token id 99999 at index 1"),
    (lambda m: generate_batch(m, [[1], [2]], [3, 4, 5]), InputError, "max_new_tokens has 3 values for 2 prompts"),
    (lambda m: generate_batch(m, [[1], [2]], temperature=[0.5, -1]), InputError, "prompt 1: temperature"),
    (lambda m: generate_batch(m, [[1], list(range(250))], 10), ContextLengthError, "prompt 1: prompt of 250 tokens"),
    (lambda m: generate_batch(m, [[1] * 30], 10, kv_cache_tokens=32), InputError,
     "prompt 0: 30 prompt tokens + 10 new tokens need 48 cache positions"),
    (lambda m: generate_batch(m, [[1]], max_batch_size=0), InputError, "max_batch_size must be an integer >= 1"),
    (lambda m: generate_batch(m, [[1]], kv_cache_tokens=0), InputError, "kv_cache_tokens must be an integer >= 1"),
    (lambda m: generate_batch(m, "hello"), InputError, "prompts must be a list"),
])
def test_every_request_is_checked_before_any_work_and_named_by_index(tiny_model, call, error, message):
    with pytest.raises(error, match=re.escape(message)):
        call(tiny_model)


def test_a_prompt_too_long_is_not_told_of_an_option_generate_batch_lacks(tiny_model):
    with pytest.raises(ContextLengthError, match=r"^prompt 1: prompt of 250 tokens \+ 10 new tokens need 259 positions "
                                                 r"\(the last new token is never fed\), beyond the context of 256 "
                                                 r"\(n_positions\); shorten them$"):
        generate_batch(tiny_model, [[1], [1] * 250], max_new_tokens=10)


def test_the_pool_defaults_to_max_batch_size_whole_contexts_and_never_holds_more(tiny_model):
    assert Engine(tiny_model, max_batch_size=3).pool.n_pages * PAGE == 3 * tiny_model.config.n_positions
    huge = Engine(tiny_model, max_batch_size=3, kv_cache_tokens=10**30)
    assert huge.pool.n_pages * PAGE == 3 * tiny_model.config.n_positions


def test_a_pool_that_cannot_be_reserved_is_an_input_error_naming_what_to_lower(tiny_model):
    with pytest.raises(InputError, match="lower kv_cache_tokens or max_batch_size"):
        Engine(tiny_model, max_batch_size=10**30)


def test_generate_batch_holds_no_more_than_a_whole_context_per_prompt(tiny_model, monkeypatch):
    """A huge max_batch_size or kv_cache_tokens allocates no more than the prompts can use at once."""
    sizes = []
    real = minigpt.engine.paging.PagePool.__init__
    monkeypatch.setattr(minigpt.engine.paging.PagePool, "__init__",
                        lambda self, config, n: (sizes.append(n), real(self, config, n))[1])
    generate_batch(tiny_model, [[1]] * 2, 4, max_batch_size=10**30)
    generate_batch(tiny_model, [[1]] * 2, 4, kv_cache_tokens=10**30)
    assert [n * PAGE for n in sizes] == [2 * tiny_model.config.n_positions] * 2


@pytest.mark.parametrize("stop", ["error", "interrupt", "close"])
def test_every_page_is_back_in_the_pool_after_an_error_an_interrupt_or_an_early_stop(tiny_model, stop):
    requests, engine = requests_and_pool(tiny_model, [list(range(30))] * 3, [5, 40, 40], 256)
    pool = engine.pool
    steps = []

    def on_tokens(n):
        steps.append(n)
        if len(steps) == 5 and stop != "close":
            raise RuntimeError("boom") if stop == "error" else KeyboardInterrupt

    loop = run(engine, requests, on_tokens)
    if stop == "close":
        next(loop, None)  # the first finished sequence, mid-batch
        assert pool.in_use > 0
        loop.close()
    else:
        with pytest.raises(RuntimeError if stop == "error" else KeyboardInterrupt):
            list(loop)
    assert pool.in_use == 0 and pool.peak_in_use > 0


def test_finished_sequences_leave_and_waiting_ones_join(tiny_model):
    """Continuous batching: with one place, the short request does not wait for the long one to
    start, and all finish with their own lengths."""
    requests, engine = requests_and_pool(tiny_model, [[1], [2], [3]], [30, 2, 2], 256, max_batch_size=2)
    order = [i for i, _ in run(engine, requests)]
    assert order == [1, 2, 0]


def test_a_page_is_zeroed_when_taken_so_a_last_page_read_whole_reads_no_old_keys(tiny_model):
    """The exact kernels read a sequence's last page whole: a page taken from the pool holds zeros,
    whatever an earlier sequence left in it (here NaN everywhere), and the logits are those of a
    fresh pool, bit for bit."""
    from minigpt.exact.batched import forward_batch
    from minigpt.engine.paging import PagedCache, PagePool

    def logits(pool):
        cache = PagedCache(pool)
        assert pool.grow(cache, 21)
        return forward_batch(tiny_model, [list(range(100, 121))], [cache], [0])[0]

    fresh, stale = PagePool(tiny_model.config, 4), PagePool(tiny_model.config, 4)
    stale.k[:], stale.v[:] = np.nan, np.nan
    assert (logits(stale).view(np.uint32) == logits(fresh).view(np.uint32)).all()


@pytest.mark.parametrize("paged", [False, True], ids=["cache", "paged-cache"])
def test_a_length_set_back_by_hand_continues_bitwise_as_a_truncated_cache(tiny_model, paged):
    """Old values past a cache's length (NaN, -0.0, 1e30), left by a length set back by hand: the
    next forward gives the bits of a cache truncated to that length (a KVCache's attention reads
    no slot past its length; a pool's cache zeroes what a length set back forgets)."""
    def cache_of(ids):
        if not paged:
            cache = tiny_model.new_cache(64)
        else:
            pool = minigpt.engine.paging.PagePool(tiny_model.config, 4)
            cache = minigpt.engine.paging.PagedCache(pool)
            pool.grow(cache, 64)
        tiny_model.forward(ids, cache)
        return cache

    expected = tiny_model.forward([7, 8], cache_of(list(range(100, 118))))
    for old in (np.nan, -0.0, 1e30):
        cache = cache_of(list(range(100, 140)))
        store, slots = (cache, slice(30, 64)) if not paged else (cache.pool, cache.slots(30, 64))
        store.k[:, :, slots], store.v[:, :, slots] = old, old  # positions 18 .. 29 keep their values
        cache.length = 18
        got = tiny_model.forward([7, 8], cache)
        np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("kind", [np.int8, np.uint8, np.int16])
def test_a_length_of_a_small_numpy_integer_type_continues_as_a_python_int(tiny_model, kind):
    """A cache's length set by hand as a NumPy integer near its type's limit: the forward counts on
    from it as from the same Python int (no wrap past 127 or 255, no OverflowError)."""
    reference = tiny_model.new_cache()
    tiny_model.forward(list(range(100, 220)), reference)
    expected = tiny_model.forward(list(range(300, 320)), reference)
    cache = tiny_model.new_cache()
    tiny_model.forward(list(range(100, 220)), cache)
    cache.length = kind(120)
    got = tiny_model.forward(list(range(300, 320)), cache)
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    assert cache.length == 140 and type(cache.length) is int


def test_a_paged_cache_set_back_holds_zeros_after_its_length(tiny_model):
    """Setting a pool's cache's length back zeroes what it forgets, as a page comes from the pool:
    the exact kernels read its last page whole, in place."""
    pool = minigpt.engine.paging.PagePool(tiny_model.config, 4)
    cache = minigpt.engine.paging.PagedCache(pool)
    pool.grow(cache, 40)
    tiny_model.forward(list(range(100, 140)), cache)
    cache.length = 18
    forgotten = cache.slots(18, 48)
    assert not pool.k[:, :, forgotten].any() and not pool.v[:, :, forgotten].any()
    assert pool.k[:, :, cache.slots(0, 18)].all()
