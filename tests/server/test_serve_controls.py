"""The server honours the sampling controls, each equal to `minigpt.generate` alone with the same
options: logit_bias, presence_penalty, frequency_penalty and best_of through the official `openai`
client's own arguments, repetition_penalty and min_tokens (vLLM's) through `extra_body`. best_of
samples candidate j with seed + j and answers the n of highest cumulative log-probability; a bad
value is a 400 naming its field, and the server goes on serving."""

from __future__ import annotations

import pytest
from serving import post
from serving import client, model, served  # noqa: F401 (fixtures)

import minigpt

openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install -e '.[test]')")

PROMPT = "The dog ran to the park"
CONTROLS = dict(logit_bias={11: 5, 50256: -100}, presence_penalty=0.5, frequency_penalty=1.5,
                repetition_penalty=1.3, min_tokens=3)


def create(client, **fields):
    """A completion of PROMPT with the controls, each sent as the client sends it."""
    return client.completions.create(
        model="random-tiny", prompt=PROMPT, logit_bias={str(k): v for k, v in CONTROLS["logit_bias"].items()},
        presence_penalty=CONTROLS["presence_penalty"], frequency_penalty=CONTROLS["frequency_penalty"],
        extra_body={"repetition_penalty": CONTROLS["repetition_penalty"], "min_tokens": CONTROLS["min_tokens"]},
        **fields)


def test_controls_greedy_are_generate_s_alone_with_the_raw_log_probabilities(model, client):
    answer = create(client, max_tokens=8, temperature=0, logprobs=2)
    alone = minigpt.generate(model, minigpt.encode(model.tokenizer, PROMPT), 8, top_logprobs=2, **CONTROLS)
    choice = answer.choices[0]
    assert choice.text == alone.text and choice.logprobs.token_logprobs == alone.logprobs
    assert [list(top.values()) for top in choice.logprobs.top_logprobs] == [[lp for _, lp in step]
                                                                             for step in alone.top_logprobs]


def test_controls_sampled_choice_j_is_generate_s_alone_with_seed_plus_j(model, client):
    answer = create(client, max_tokens=8, temperature=0.9, n=2, seed=5, logprobs=0)
    for j, choice in enumerate(answer.choices):
        alone = minigpt.generate(model, minigpt.encode(model.tokenizer, PROMPT), 8, temperature=0.9, seed=5 + j,
                                 **CONTROLS)
        assert choice.text == alone.text and choice.logprobs.token_logprobs == alone.logprobs


def test_best_of_answers_the_n_candidates_of_highest_cumulative_log_probability_and_counts_them_all(model, client):
    answer = client.completions.create(model="random-tiny", prompt=PROMPT, max_tokens=6, temperature=1.0, n=2,
                                       best_of=5, seed=7, logprobs=0)
    ids = minigpt.encode(model.tokenizer, PROMPT)
    candidates = [minigpt.generate(model, ids, 6, temperature=1.0, seed=7 + j) for j in range(5)]
    best = sorted(candidates, key=lambda r: -sum(r.logprobs))[:2]
    assert [c.index for c in answer.choices] == [0, 1]
    assert [c.text for c in answer.choices] == [r.text for r in best]
    assert [c.logprobs.token_logprobs for c in answer.choices] == [r.logprobs for r in best]
    assert answer.usage.completion_tokens == sum(len(r.tokens) for r in candidates)
    assert answer.usage.prompt_tokens == len(ids)


def test_best_of_equal_to_n_streams_the_choices_as_generated(model, client):
    chunks = client.completions.create(model="random-tiny", prompt=PROMPT, max_tokens=4, temperature=1.0, n=2,
                                       best_of=2, seed=3, stream=True)
    texts = ["", ""]
    for chunk in chunks:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
    ids = minigpt.encode(model.tokenizer, PROMPT)
    assert texts == [minigpt.generate(model, ids, 4, temperature=1.0, seed=3 + j).text for j in range(2)]


@pytest.mark.parametrize("fields, param, words", [
    ({"best_of": 3, "stream": True}, "best_of", "cannot be streamed"),
    ({"n": 3, "best_of": 2}, "best_of", "an integer in n..20"),
    ({"logit_bias": {"50257": 1}}, "logit_bias", "outside the vocabulary [0, 50257)"),
    ({"logit_bias": {"11": 100.5}}, "logit_bias", "a bias is a number in [-100, 100]"),
    ({"presence_penalty": -2.5}, "presence_penalty", "presence_penalty must be a number in [-2, 2], got -2.5"),
    ({"frequency_penalty": "1"}, "frequency_penalty", "frequency_penalty must be a number in [-2, 2], got '1'"),
    ({"repetition_penalty": -1}, "repetition_penalty", "repetition_penalty must be a number in [1e-100, 1e100]"),
    ({"min_tokens": 20}, "min_tokens", "min_tokens must be at most max_tokens (16), got 20"),
])
def test_a_bad_control_is_a_400_naming_its_field_and_the_server_goes_on(model, served, fields, param, words):
    status, _, answer = post(served[1], "/v1/completions", {"prompt": PROMPT, **fields})
    assert (status, answer["error"]["param"]) == (400, param) and words in answer["error"]["message"]
    status, _, answer = post(served[1], "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": 0})
    assert status == 200 and answer["choices"][0]["finish_reason"] == "length"


def test_a_prompt_of_several_names_the_one_at_fault(served):
    status, _, answer = post(served[1], "/v1/completions", {"prompt": [[1, 2], [3, 50257]]})
    assert (status, answer["error"]["param"]) == (400, "prompt")
    assert answer["error"]["message"].startswith("prompt 1: token id 50257 at index 1 is outside")
