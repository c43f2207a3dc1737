"""The prefix cache is exact: with it off, cold or warm, a request's tokens, log-probabilities and
prompt log-probabilities are bitwise the same, whatever it shares with the others, the order they
arrive in, and the evictions and preemptions a tight pool forces; and the pool's pages add up."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from strategies import models, sampling, token_ids

from minigpt.scripted.api import Engine, score
from minigpt.engine.paging import pages_for


@st.composite
def prompts_sharing_prefixes(draw, config) -> list[list[int]]:
    """2-6 prompts cut from one base: its prefixes (page-aligned or not), equal copies, the base
    extended, and unrelated ones."""
    limit = config.n_positions - 1  # room for one new token
    base = draw(token_ids(config, min_size=1, max_size=limit), label="base")
    prompts = []
    for _ in range(draw(st.integers(2, 6), label="prompts")):
        kind = draw(st.sampled_from(["prefix", "equal", "extended", "other"]), label="kind")
        cut = draw(st.integers(1, len(base)), label="cut")
        if kind == "prefix":
            prompts.append(base[:cut])
        elif kind == "equal":
            prompts.append(list(base))
        elif kind == "extended":
            prompts.append(base[:cut] + draw(token_ids(config, min_size=0, max_size=limit - cut), label="tail"))
        else:
            prompts.append(draw(token_ids(config, max_size=limit), label="other"))
    return prompts


def results(engine: Engine, prompts, order, lengths, options, scoring, top):
    """engine.generate over the prompts in `order`, returned in prompt order."""
    done = engine.generate([prompts[i] for i in order], [lengths[i] for i in order],
                           prompt_logprobs=[scoring[i] for i in order], top_logprobs=top,
                           **{key: [options[i][key] for i in order] for key in options[0]})
    back = [None] * len(prompts)
    for i, result in zip(order, done):
        back[i] = result
    return back


def essentials(result):
    return result.tokens, result.logprobs, result.top_logprobs, result.prompt_logprobs, result.prompt_top_logprobs


def assert_pages_add_up(engine: Engine):
    stats = engine.stats()
    assert stats["pages_in_use"] == 0
    assert stats["pages_in_use"] + stats["pages_cached"] + stats["pages_free"] == stats["pages_total"]


@given(st.data())
def test_prefix_cache_exactness_off_cold_and_warm_give_bitwise_the_same_results(data):
    """Cache off, then a cold engine, then the same engine again (warm) with the prompts arriving
    in another order: every result's tokens, log-probabilities and prompt log-probabilities (top
    ones included) are identical, greedy or seeded sampling, on pools from the tightest that fits
    to ample (evicting cached pages, preempting running ones)."""
    model = data.draw(models(min_positions=2))
    prompts = data.draw(prompts_sharing_prefixes(model.config))
    n = len(prompts)
    lengths = [data.draw(st.integers(0, model.config.n_positions - len(p)), label="max_new_tokens") for p in prompts]
    options = [data.draw(sampling, label="sampling") for _ in prompts]
    scoring = [data.draw(st.booleans(), label="prompt_logprobs") for _ in prompts]
    top = data.draw(st.integers(0, 3), label="top_logprobs")
    largest = max(pages_for(len(p) + max(m, 1) - 1) for p, m in zip(prompts, lengths))
    pool = data.draw(st.integers(largest, largest * n + 2), label="pool pages") * 16
    batch = data.draw(st.integers(1, n), label="max_batch_size")
    order = data.draw(st.permutations(range(n)), label="warm order")

    off = results(Engine(model, max_batch_size=batch, kv_cache_tokens=pool, prefix_cache=False),
                  prompts, range(n), lengths, options, scoring, top)
    engine = Engine(model, max_batch_size=batch, kv_cache_tokens=pool)
    cold = results(engine, prompts, range(n), lengths, options, scoring, top)
    assert_pages_add_up(engine)
    warm = results(engine, prompts, order, lengths, options, scoring, top)
    assert_pages_add_up(engine)
    for prompt, want_scores, a, b, c in zip(prompts, scoring, off, cold, warm):
        assert essentials(a) == essentials(b) == essentials(c)
        assert a.cached_tokens == 0
        if want_scores and len(prompt) > 1:
            assert a.prompt_logprobs[1:] == score(model, prompt).tolist()
