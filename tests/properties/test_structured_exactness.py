"""Constrained decoding is exact: a request constrained by a regex, a JSON schema, a choice or a
grammar gets bitwise the same tokens and log-probabilities alone, in a batch of any make-up,
preempted and recomputed, with its prefix cached or not, and (greedy) under speculative decoding
with any drafter, whose drafts outside the grammar are never kept; and what it ends with as "stop"
matches its constraint whole.

The models are small random GPT-2s with GPT-2's vocabulary (so that the grammar's tokens are
GPT-2's): their choices are arbitrary, which is what a property wants.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from minigpt.testing.strategies import CONSTRAINTS, controls, gpt2_vocab_models, sampling

from minigpt.engine.paging import PAGE, pages_for
from minigpt.engine.drafters import ModelDrafter, NGramDrafter
from minigpt.engine.speculative import DraftCounts, speculative_steps
from minigpt.loading.model import Model
from minigpt.gpt2.config import GPT2_VOCAB_SIZE
from minigpt.loop.loops import cached_steps
from minigpt.loop.sequence import Sequence
from minigpt.engine.engine import Engine
from requesting import new_request

pytest.importorskip("llguidance", reason="the structured extra (llguidance) is not installed")

EOS = GPT2_VOCAB_SIZE - 1


@st.composite
def constrained_requests(draw, model: Model) -> dict:
    """A prompt (any ids, <|endoftext|> included), max_new_tokens up to the context, sampling options,
    stop_at_eos, the controls (biases and penalties, which the mask must win over) and at most one
    constraint."""
    size = draw(st.integers(1, model.config.n_positions - 7), label="prompt length")  # room for 8 new tokens
    prompt = draw(st.lists(st.integers(0, EOS), min_size=size, max_size=size), label="prompt")
    keyword, value, _ = draw(st.sampled_from([*CONSTRAINTS, (None, None, None)]), label="constraint")
    max_new_tokens = draw(st.integers(0, model.config.n_positions - size + 1), label="max_new_tokens")
    return dict(prompt_ids=prompt, max_new_tokens=max_new_tokens, stop_at_eos=draw(st.booleans(), label="stop_at_eos"),
                **draw(sampling, label="sampling"), **draw(controls(GPT2_VOCAB_SIZE, max_new_tokens)),
                **({keyword: value} if keyword else {}))


def alone(model: Model, request: dict):
    seq = Sequence(new_request(model, **request))
    for _ in cached_steps(model, seq):
        pass
    return seq.result(use_cache=True)


def essentials(result) -> tuple:
    return result.tokens, result.logprobs, result.finish_reason, result.text


def assert_matches_its_constraint(model: Model, request: dict, result) -> None:
    """Every token was allowed where it was taken (walked again through a fresh matcher), the text
    ended "stop" exactly when it matched whole, and then it passes the constraint's own check."""
    keyword = next((k for k in ("regex", "json_schema", "choice", "grammar") if k in request), None)
    if keyword is None:
        assert result.finish_reason != "stop"
        return
    matcher = new_request(model, **request).processing[-1].start(())
    for token in result.tokens:
        assert matcher.allowed()[token]
        if token != EOS:
            matcher.advance(token)
    assert matcher.complete == (result.finish_reason == "stop")
    if result.finish_reason == "stop":
        check = next(check for k, v, check in CONSTRAINTS if k == keyword and v == request[keyword])
        assert check(result.text), result.text


@given(st.data())
def test_constrained_requests_get_bitwise_their_solo_results_in_any_batch_preempted_or_prefix_cached(data):
    """1-5 requests, constrained or not, on an engine with max_batch_size 1..n + 1 and a pool from the
    tightest that fits the largest to ample (preempting and recomputing), run with the prefix cache
    off, cold, then warm in another order: every result is bitwise the request's solo result."""
    model = data.draw(gpt2_vocab_models())
    requests = data.draw(st.lists(constrained_requests(model), min_size=1, max_size=5), label="requests")
    largest = max(pages_for(len(r["prompt_ids"]) + max(r["max_new_tokens"], 1) - 1) for r in requests)
    pool = data.draw(st.integers(largest, largest * len(requests) + 1), label="pool pages") * PAGE
    batch = data.draw(st.integers(1, len(requests) + 1), label="max_batch_size")
    order = data.draw(st.permutations(range(len(requests))), label="warm order")
    solo = [alone(model, r) for r in requests]
    for r, result in zip(requests, solo):
        assert_matches_its_constraint(model, r, result)

    def engine_results(engine: Engine, order) -> list:
        checked = [new_request(model, **requests[i]) for i in order]
        back = [None] * len(requests)
        for j, result in engine.results(engine.jobs_for(checked)):
            back[order[j]] = result
        return back

    off = engine_results(Engine(model, max_batch_size=batch, kv_cache_tokens=pool, prefix_cache=False),
                         range(len(requests)))
    engine = Engine(model, max_batch_size=batch, kv_cache_tokens=pool)
    cold = engine_results(engine, range(len(requests)))
    warm = engine_results(engine, order)
    for results in (off, cold, warm):
        assert [essentials(r) for r in results] == [essentials(r) for r in solo]


class RandomDrafter:
    """Proposes random tokens of the whole vocabulary: almost always outside the grammar."""

    def __init__(self, seed: int):
        self.rng = __import__("numpy").random.default_rng(seed)

    def propose(self, ids, k, options, rng):
        return self.rng.integers(GPT2_VOCAB_SIZE, size=k).tolist(), None

    def accepted(self, n_positions):
        pass


@given(st.data())
def test_constrained_greedy_speculative_tokens_are_bitwise_plain_greedy_and_never_leave_the_grammar(data):
    """Greedy, with prompt lookup, the model as its own draft model (unconstrained: its drafts leave
    the grammar) or random drafts, and any k: the tokens and log-probabilities are plain decoding's,
    so no draft outside the grammar was kept and the grammar's state never saw a rejected one."""
    model = data.draw(gpt2_vocab_models())
    request = data.draw(constrained_requests(model), label="request")
    request.update(temperature=0.0, top_k=None, top_p=None, seed=None)
    kind = data.draw(st.sampled_from(["ngram", "self", "random"]), label="drafter")
    k = data.draw(st.integers(1, 6), label="draft_tokens")
    plain = alone(model, request)
    seq = Sequence(new_request(model, **request))
    drafter = {"ngram": NGramDrafter(), "self": ModelDrafter(model, seq.request.max_positions),
               "random": RandomDrafter(data.draw(st.integers(0, 99)))}[kind]
    for _ in speculative_steps(model, seq, drafter, k, DraftCounts()):
        pass
    assert essentials(seq.result(use_cache=True)) == essentials(plain)
    assert_matches_its_constraint(model, request, plain)
