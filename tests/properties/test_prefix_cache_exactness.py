"""The prefix cache is exact: with it off, cold or warm, a request's tokens, log-probabilities and
prompt log-probabilities are bitwise the same, whatever it shares with the others, the order they
arrive in, and the evictions and preemptions a tight pool forces; and the pool's pages add up."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from minigpt.testing.strategies import controls, models, per_prompt, sampling, token_ids

from minigpt.engine.engine import Engine
from minigpt.api.api import score
from minigpt.engine.paging import PAGE, pages_for


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
                           **per_prompt([options[i] for i in order]))
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
    ones included) are identical, greedy or seeded sampling, with or without logit_bias, penalties
    and min_tokens, on pools from the tightest that fits
    to ample (evicting cached pages, preempting running ones)."""
    model = data.draw(models(min_positions=2))
    prompts = data.draw(prompts_sharing_prefixes(model.config))
    n = len(prompts)
    lengths = [data.draw(st.integers(0, model.config.n_positions - len(p)), label="max_new_tokens") for p in prompts]
    options = [{**data.draw(sampling, label="sampling"), **data.draw(controls(model.config.vocab_size, m))}
               for m in lengths]
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


@st.composite
def prompts_of_repeated_pages(draw, config) -> list[list[int]]:
    """2-5 prompts built from a few page-sized blocks, repeated and permuted (so one prompt's first
    page is often another's later page, or the same page after another prefix), each with a tail."""
    blocks = [draw(st.lists(st.integers(0, config.vocab_size - 1), min_size=PAGE, max_size=PAGE), label="block")
              for _ in range(draw(st.integers(1, 3), label="blocks"))]
    most = (config.n_positions - 2) // PAGE  # whole pages that leave room for a tail of one
    prompts = []
    for _ in range(draw(st.integers(2, 5), label="prompts")):
        chosen = draw(st.lists(st.sampled_from(blocks), min_size=1, max_size=most), label="pages")
        tail = draw(st.lists(st.integers(0, config.vocab_size - 1), min_size=1,
                             max_size=config.n_positions - 1 - PAGE * len(chosen)), label="tail")
        prompts.append([t for block in chosen for t in block] + tail)
    return prompts


def pages_under_the_same_whole_prefix(prompt: list[int], earlier: list[list[int]]) -> int:
    """Full pages of `prompt` before its last id whose whole prefix (the page and every page before
    it) an earlier prompt, fed whole, wrote."""
    most = (len(prompt) - 1) // PAGE
    return max((j for q in earlier for j in range(min(most, len(q) // PAGE) + 1)
                if q[:j * PAGE] == prompt[:j * PAGE]), default=0)


@given(st.data())
def test_the_prefix_cache_reuses_a_page_only_under_the_same_whole_prefix(data):
    """Prompts of repeated and permuted page-sized blocks, one call after another on one engine:
    each result is bitwise what the engine without a prefix cache gives, and its cached_tokens are
    exactly the pages whose whole prefix an earlier prompt wrote (a page equal to another at another
    place, or after another prefix, is never taken)."""
    model = data.draw(models(min_positions=2 * PAGE + 2))
    prompts = data.draw(prompts_of_repeated_pages(model.config), label="prompts")
    warm, cold = Engine(model, max_batch_size=16), Engine(model, max_batch_size=16, prefix_cache=False)
    for i, prompt in enumerate(prompts):
        [hot], [plain] = warm.generate([prompt], 1), cold.generate([prompt], 1)
        assert hot.tokens == plain.tokens and hot.logprobs == plain.logprobs
        assert hot.cached_tokens == PAGE * pages_under_the_same_whole_prefix(prompt, prompts[:i])
