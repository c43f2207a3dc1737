"""A numerical failure is the sequence's own: when the weights overflow on one sequence's ids, that
sequence alone fails (its job's error, its choice's 500) and every other sequence of the batch, a
stream among them, goes on to the tokens it gets alone. A control at its documented limit never
causes one (tests/properties/test_controls_finite.py); a value beyond it is refused before any work."""

from __future__ import annotations

import http.client
import json
import threading

import numpy as np
import pytest
from checkpoints import with_huge_position

import minigpt
from minigpt.errors import InputError, NumericalError
from requesting import new_request, submitted


@pytest.fixture(scope="module")
def broken(tiny_model):
    return with_huge_position(tiny_model, 200)  # overflows in block 0 for a sequence that reaches position 200


def test_an_overflowing_job_fails_alone_and_the_others_in_its_batch_get_their_tokens_alone(broken):
    engine = minigpt.Engine(broken, max_batch_size=4)
    good = submitted(engine, new_request(broken, [1, 2], 5, stop_at_eos=False))
    bad = submitted(engine, new_request(broken, [3] * 194, 12, stop_at_eos=False))  # feeds position 200 its 7th token
    with np.errstate(over="ignore", invalid="ignore"):
        finished = list(engine.run())
    assert set(finished) == {good, bad} and good.error is None and isinstance(bad.error, NumericalError)
    assert good.result().tokens == minigpt.generate(broken, [1, 2], 5, stop_at_eos=False).tokens
    assert len(bad.result().tokens) == 7 and bad.result().finish_reason == "abort"


@pytest.mark.parametrize("value", [0, 5e-324, 1e-300, 1e101, float("inf")])
def test_a_repetition_penalty_beyond_its_float64_bounds_is_refused_before_any_work(tiny_model, value):
    with pytest.raises(InputError, match=r"repetition_penalty must be a number in \[1e-100, 1e100\]"):
        minigpt.generate(tiny_model, [1, 2], 3, repetition_penalty=value)


@pytest.mark.parametrize("value", [1e-100, 1e100])
@pytest.mark.parametrize("run", ["generate", "speculative", "generate_batch"])
def test_a_repetition_penalty_at_its_bounds_samples_finite_tokens_in_every_loop(tiny_model, value, run):
    """1e-100 divides the seen tokens' positive logits up to 1e100 times their size: they are chosen
    (greedy: the first of them is the largest), and sampling draws without a NaN."""
    prompt, options = [464, 3290, 13], dict(repetition_penalty=value, temperature=1.0, seed=3, stop_at_eos=False)
    if run == "generate_batch":
        results = minigpt.generate_batch(tiny_model, [prompt, [11]], 6, **options)
    else:
        results = [minigpt.generate(tiny_model, prompt, 6, speculate="ngram" if run == "speculative" else None,
                                     **options)]
    assert all(len(r.tokens) == 6 and np.isfinite(r.logprobs).all() for r in results)
    if value == 1e-100:  # every positive seen logit is 1e100 times larger: only seen tokens are drawn
        assert set(results[0].tokens) <= set(prompt + results[0].tokens[:1])


def test_a_served_choice_whose_weights_overflow_fails_alone_while_a_stream_beside_it_goes_on(broken):
    pytest.importorskip("starlette", reason="the serve extra is not installed (pip install -e '.[serve]')")
    from serving import post, running_server
    with running_server(broken, max_batch_size=4) as (_, url):
        host, port = url.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        connection.request("POST", "/v1/completions", json.dumps(
            {"prompt": [1, 2], "max_tokens": 150, "temperature": 0, "ignore_eos": True, "stream": True}), {"Content-Type": "application/json"})
        response = connection.getresponse()
        first = response.readline()  # the stream has begun: its choice is in the engine's batch
        answer = {}
        thread = threading.Thread(target=lambda: answer.update(overflow=post(url, "/v1/completions", {
            "prompt": list(range(201)), "max_tokens": 3})))
        thread.start()
        thread.join(60)
        rest = response.read().decode()
        connection.close()
    status, _, body = answer["overflow"]
    assert status == 500 and body["error"]["code"] == "numerical_error"
    assert body["error"]["message"].startswith("choice 0: ") and "after block 0 (h.0)" in body["error"]["message"]
    events = [json.loads(line[6:]) for line in (first.decode() + rest).splitlines()
              if line.startswith("data: {")]
    assert rest.rstrip().endswith("data: [DONE]") and not any("error" in e for e in events)
    assert "".join(e["choices"][0]["text"] for e in events) == minigpt.generate(
        broken, [1, 2], 150, stop_at_eos=False).text
