"""The server's structured outputs through the official `openai` client (every field through
`extra_body`: none is in its signature): vLLM's structured_outputs object, its older guided_* fields
and OpenAI's response_format, each giving what `minigpt.generate` gives alone with the library's
keyword; "stop" when the text matches whole, "length" when cut; a bad or doubled constraint is a 400
naming the field the request used, and the server goes on serving."""

from __future__ import annotations

import json

import pytest
from serving import post
from serving import client, model, served  # noqa: F401 (fixtures)

import minigpt

openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install -e '.[test]')")
pytest.importorskip("llguidance", reason="the structured extra (llguidance) is not installed")

PROMPT = "The answer is"
SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["n"], "additionalProperties": False}
GRAMMAR = 'start: "(" /[a-c]{1,3}/ ")"'
FIELDS = [  # (extra_body, the library's keyword and value)
    ({"structured_outputs": {"regex": "[0-9]{1,3}"}}, {"regex": "[0-9]{1,3}"}),
    ({"structured_outputs": {"json": SCHEMA}}, {"json_schema": SCHEMA}),
    ({"structured_outputs": {"choice": ["yes", "no thanks"]}}, {"choice": ["yes", "no thanks"]}),
    ({"structured_outputs": {"grammar": GRAMMAR}}, {"grammar": GRAMMAR}),
    ({"structured_outputs": {"json_object": True}}, {"json_schema": {"type": "object"}}),
    ({"guided_regex": "[0-9]{1,3}"}, {"regex": "[0-9]{1,3}"}),
    ({"guided_json": json.dumps(SCHEMA)}, {"json_schema": SCHEMA}),
    ({"guided_choice": ["yes", "no thanks"]}, {"choice": ["yes", "no thanks"]}),
    ({"guided_grammar": GRAMMAR}, {"grammar": GRAMMAR}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA, "strict": True}}},
     {"json_schema": SCHEMA}),
    ({"response_format": {"type": "json_object"}}, {"json_schema": {"type": "object"}}),
    ({"response_format": {"type": "text"}}, {}),
]


@pytest.mark.parametrize("extra_body, keywords", FIELDS)
def test_each_field_gives_generate_s_text_alone_with_the_library_s_keyword(model, client, extra_body, keywords):
    answer = client.completions.create(model="random-tiny", prompt=PROMPT, max_tokens=24, temperature=0.7, seed=4,
                                       logprobs=0, extra_body=extra_body)
    alone = minigpt.generate(model, minigpt.encode(model.tokenizer, PROMPT), 24, temperature=0.7, seed=4, **keywords)
    choice = answer.choices[0]
    assert (choice.text, choice.logprobs.token_logprobs) == (alone.text, alone.logprobs)
    assert choice.finish_reason == {"eos": "stop", "stop": "stop", "length": "length"}[alone.finish_reason]


def test_a_text_that_matches_whole_ends_stop_and_one_cut_short_length(client):
    whole = client.completions.create(model="random-tiny", prompt=PROMPT, max_tokens=16, temperature=0,
                                      extra_body={"structured_outputs": {"choice": ["yes", "no thanks"]}})
    assert whole.choices[0].text in ("yes", "no thanks") and whole.choices[0].finish_reason == "stop"
    cut = client.completions.create(model="random-tiny", prompt=PROMPT, max_tokens=1, temperature=0,
                                    extra_body={"guided_choice": ["yes please", "no thanks"]})
    assert cut.choices[0].finish_reason == "length"


def test_a_constrained_stream_is_the_whole_answer_in_pieces(client):
    fields = dict(model="random-tiny", prompt=PROMPT, max_tokens=24, temperature=0.9, seed=2, n=2,
                  extra_body={"structured_outputs": {"json": SCHEMA}})
    whole = client.completions.create(**fields)
    texts = {0: "", 1: ""}
    for chunk in client.completions.create(stream=True, **fields):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert texts == {c.index: c.text for c in whole.choices}
    assert all(json.loads(c.text)["n"] in range(10) for c in whole.choices if c.finish_reason == "stop")


@pytest.mark.parametrize("body, param, says", [
    ({"structured_outputs": {"regex": "(("}}, "structured_outputs.regex", "structured_outputs.regex does not compile"),
    ({"guided_regex": "(("}, "guided_regex", "guided_regex does not compile"),
    ({"guided_json": "{bad"}, "guided_json", "guided_json is not valid JSON"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "foo"}}}},
     "response_format.json_schema.schema", "response_format.json_schema.schema does not compile"),
    ({"guided_choice": "yes"}, "guided_choice", "guided_choice must be a non-empty list of strings"),
    ({"structured_outputs": {"regex": "a"}, "guided_choice": ["a"]}, "structured_outputs.regex",
     "guided_choice and structured_outputs.regex both constrain the text"),
    ({"guided_json": SCHEMA, "response_format": {"type": "json_object"}}, "response_format",
     "guided_json and response_format both constrain the text"),
    ({"structured_outputs": {"whitespace_pattern": " "}}, "structured_outputs.whitespace_pattern", "not supported"),
    ({"structured_outputs": "[0-9]"}, "structured_outputs", "structured_outputs must be an object"),
    ({"structured_outputs": {"json_object": 1}}, "structured_outputs.json_object", "must be true or false"),
    ({"response_format": {"type": "xml"}}, "response_format", "response_format must be"),
    ({"guided_decoding_backend": "xgrammar"}, "guided_decoding_backend", "Unrecognized request argument"),
])
def test_a_bad_constraint_is_a_400_naming_the_field_and_the_server_goes_on(served, client, body, param, says):
    status, _, answer = post(served[1], "/v1/completions", {"model": "random-tiny", "prompt": PROMPT, **body})
    assert status == 400 and answer["error"]["param"] == param and says in answer["error"]["message"], answer
    assert client.completions.create(model="random-tiny", prompt=PROMPT, max_tokens=2).choices[0].text is not None


def test_a_grammar_that_gives_up_mid_way_fails_its_own_choice_only(served, client):
    """llguidance gives up on this grammar at its first token (its item limit), inside an engine step
    shared with another request: that choice is a 400 naming its field, the other is answered."""
    import concurrent.futures

    failing = {"model": "random-tiny", "prompt": PROMPT, "max_tokens": 8,
               "guided_grammar": 'start: ("b" | "c") rest\nrest: "a" rest'}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        other = pool.submit(client.completions.create, model="random-tiny", prompt=PROMPT, max_tokens=40,
                            temperature=0, extra_body={"ignore_eos": True})  # still running when the other fails
        status, _, answer = post(served[1], "/v1/completions", failing)
        assert other.result().choices[0].finish_reason == "length"
    assert status == 400 and answer["error"]["param"] == "guided_grammar"
    assert answer["error"]["message"].startswith("guided_grammar cannot be followed")
