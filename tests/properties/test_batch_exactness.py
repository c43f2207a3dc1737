"""Batching is exact: a sequence's tokens and logits are bitwise the same whether it is generated
alone or in a batch, whatever the batch holds, its size, the order of arrival, the page pool's
size (down to the smallest that fits the largest request) and the preemptions that forces."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from minigpt.testing.strategies import batches, per_prompt

from minigpt.engine.engine import Engine
from minigpt.api.api import generate_batch
from minigpt.requests.request import make_requests
from minigpt.api.api import generate


@given(batches(), st.booleans())
def test_batch_equivalence_each_prompt_gets_bitwise_its_tokens_and_logprobs_alone(batch, stop_at_eos):
    """generate_batch(model, prompts, ...)[i] has exactly the tokens and log-probabilities (hence
    logits) of generate(model, prompts[i], ...) with prompt i's options, greedy or seeded sampling,
    with or without logit_bias, penalties and min_tokens, for any max_batch_size and pool size,
    preempted or not."""
    model, prompts, lengths, options, max_batch_size, kv_cache_tokens = batch
    results = generate_batch(model, prompts, lengths, stop_at_eos=stop_at_eos, max_batch_size=max_batch_size,
                             kv_cache_tokens=kv_cache_tokens, **per_prompt(options))
    for prompt, n, opts, result in zip(prompts, lengths, options, results):
        alone = generate(model, prompt, n, stop_at_eos=stop_at_eos, **opts)
        assert result.tokens == alone.tokens
        assert result.logprobs == alone.logprobs  # floats compared exactly
        assert result.finish_reason == alone.finish_reason


@given(batches())
def test_pages_every_page_is_back_in_the_pool_and_the_peak_fits(batch):
    """After a batch, every page of the pool is free again, and no more were ever in use than it has."""
    model, prompts, lengths, options, max_batch_size, kv_cache_tokens = batch
    options = dict(per_prompt(options), max_new_tokens=lengths, stop=None, stop_at_eos=True, top_logprobs=0)
    requests = make_requests(model, prompts, options)
    engine = Engine(model, max_batch_size=max_batch_size, kv_cache_tokens=kv_cache_tokens)
    pool = engine.pool
    finished = sorted(i for i, _ in engine.results(engine.jobs_for(requests)))
    assert finished == list(range(len(prompts)))
    assert pool.in_use == 0 and pool.peak_in_use <= pool.n_pages
