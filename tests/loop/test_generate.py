"""The generation API: the naive loop and the cached loop, greedy and sampled."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import minigpt
from minigpt.gpt2.config import GPT2Config
from minigpt.loop.loops import cached_steps, naive_steps
from requesting import new_request
from minigpt.loop.sequence import Sequence
from minigpt.loading.model import Model
from minigpt.loading.weights import random_params

CONFIG = GPT2Config(vocab_size=50, n_positions=48, n_embd=16, n_layer=2, n_head=2, eos_token_id=7)


@pytest.fixture(scope="module")
def model():
    return Model(CONFIG, random_params(CONFIG, seed=4, scale=20.0))


@pytest.mark.parametrize("options", [dict(), dict(temperature=1.3, top_k=20, top_p=0.9, seed=5)],
                         ids=["greedy", "sampled"])
def test_cached_and_naive_loops_generate_the_same_tokens(model, options):
    cached = minigpt.generate(model, [1, 2, 3], 30, use_cache=True, stop_at_eos=False, **options)
    naive = minigpt.generate(model, [1, 2, 3], 30, use_cache=False, stop_at_eos=False, **options)
    assert cached.tokens == naive.tokens and len(cached.tokens) == 30
    assert cached.use_cache and not naive.use_cache


def test_result_reports_prompt_tokens_and_one_time_per_token(model):
    result = minigpt.generate(model, [3, 4], 5, stop_at_eos=False)
    assert result.prompt_ids == [3, 4]
    assert len(result.step_seconds) == len(result.tokens) == 5
    assert all(np.isfinite(s) and s >= 0 for s in result.step_seconds)


def test_stream_yields_what_generate_returns(model):
    streamed = list(minigpt.stream(model, [9, 8, 7], 12, temperature=0.8, seed=2, stop_at_eos=False, top_logprobs=3))
    result = minigpt.generate(model, [9, 8, 7], 12, temperature=0.8, seed=2, stop_at_eos=False, top_logprobs=3)
    assert [s.token for s in streamed] == result.tokens
    assert [s.logprob for s in streamed] == result.logprobs
    assert [s.top_logprobs for s in streamed] == result.top_logprobs


def test_generation_stops_after_end_of_text_unless_told_not_to(model):
    # Find a seed whose hot sample reaches the eos token (7) within the context.
    for seed in range(100):
        tokens = minigpt.generate(model, [1], 40, temperature=5.0, seed=seed, stop_at_eos=False).tokens
        if CONFIG.eos_token_id in tokens[:-1]:
            break
    else:
        pytest.fail("no seed reaches eos")
    stopped = minigpt.generate(model, [1], 40, temperature=5.0, seed=seed).tokens
    assert stopped == tokens[: tokens.index(CONFIG.eos_token_id) + 1]


def test_different_seeds_sample_differently_and_the_same_seed_repeats(model):
    runs = [minigpt.generate(model, [1], 20, temperature=2.0, seed=s, stop_at_eos=False).tokens for s in (0, 0, 1)]
    assert runs[0] == runs[1] != runs[2]


def test_the_naive_loop_feeds_the_whole_sequence_and_the_cached_loop_one_token(model, loop_feeds):
    fed = loop_feeds
    list(naive_steps(model, sequence(model, [1, 2, 3], 4)))
    assert fed == [3, 4, 5, 6]  # every position so far, every step
    fed.clear()
    list(cached_steps(model, sequence(model, [1, 2, 3], 4)))
    assert fed == [3, 1, 1, 1]  # the prompt once, then one new position per step


def test_empty_prompt_starts_from_end_of_text(model):
    result = minigpt.generate(model, [], 3, stop_at_eos=False)
    assert result.prompt_ids == [CONFIG.eos_token_id]


def test_zero_new_tokens_is_an_empty_result(model):
    assert minigpt.generate(model, [1], 0).tokens == []


def test_logits_of_every_step_are_bitwise_equal_between_the_loops(model):
    naive = list(naive_steps(model, sequence(model, [5, 6], 10)))
    cached = list(cached_steps(model, sequence(model, [5, 6], 10)))
    assert all(np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(naive, cached))


def sequence(model, prompt, n):
    """A checked request that never stops at <|endoftext|>, ready for a loop."""
    return Sequence(new_request(model, prompt, n, stop_at_eos=False))


def test_stream_takes_generates_parameters_with_the_same_defaults_but_on_step():
    """The two public signatures state the options explicitly; this keeps the two lists from drifting apart."""
    generate_parameters = dict(inspect.signature(minigpt.generate).parameters)
    del generate_parameters["on_step"]
    assert dict(inspect.signature(minigpt.stream).parameters) == generate_parameters
    assert generate_parameters["use_cache"].default is True
