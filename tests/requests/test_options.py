"""A request's options are declared once (minigpt.requests.request.OPTIONS), and every interface is
held to the declaration: the API's keywords and defaults, the command line's flags, batch's keys
and the server's fields. A bad value is one error naming the option, and each interface names it
its own way from err.param: the keyword, the flag as typed, the JSON field, the line's key."""

from __future__ import annotations

import argparse
import inspect
import json

import pytest
from commands import batch, cli

import minigpt
from minigpt.cli import build_parser
from minigpt.cli.batch import KEYS
from minigpt.errors import InputError
from minigpt.requests.request import OPTIONS

BATCHED = [name for name, option in OPTIONS.items() if option.batched]
BAD = {  # option -> a value its check refuses, and a word the message has
    "max_new_tokens": (-1, "an integer >= 0"), "temperature": (-1.0, "a finite number >= 0"),
    "top_k": (0, "an integer >= 1"), "top_p": (1.5, "a number in (0, 1]"), "seed": (-1, "an integer >= 0"),
    "stop_at_eos": ("no", "True or False"), "stop": ("x", "a list of strings"),
    "top_logprobs": (21, "an integer in 0..20"), "logit_bias": ({5: 101}, "a number in [-100, 100]"),
    "presence_penalty": (2.5, "a number in [-2, 2]"), "frequency_penalty": (-3, "a number in [-2, 2]"),
    "repetition_penalty": (0, "a number in [1e-100, 1e100]"), "min_tokens": (-1, "an integer >= 0"),
    "truncate_prompt": (1, "True or False"), "regex": (12, "must be a string"),
    "json_schema": (7, "must be a JSON schema"), "choice": ("yes", "a non-empty list of strings"),
    "grammar": (5, "must be a string"),
}


def keywords(function, ignore=()) -> dict:
    return {name: p.default for name, p in inspect.signature(function).parameters.items()
            if p.kind is p.KEYWORD_ONLY and name not in ignore} | (
        {"max_new_tokens": inspect.signature(function).parameters["max_new_tokens"].default})


def test_every_option_has_a_bad_value_here():
    assert set(BAD) == set(OPTIONS)


def test_the_api_s_keywords_and_defaults_are_the_declaration_s():
    declared = {name: option.default for name, option in OPTIONS.items()}
    batched = {name: declared[name] for name in BATCHED}
    assert keywords(minigpt.generate, ("use_cache", "speculate", "draft_tokens", "on_step")) == declared
    assert keywords(minigpt.stream, ("use_cache", "speculate", "draft_tokens")) == declared
    assert keywords(minigpt.generate_batch, ("max_batch_size", "kv_cache_tokens", "prefix_cache")) == batched
    assert keywords(minigpt.Engine.generate, ("prompt_logprobs",)) == batched


def test_a_keyword_the_api_does_not_take_is_python_s_type_error(tiny_model):
    with pytest.raises(TypeError, match="generate\\(\\) got an unexpected keyword argument 'temprature'"):
        minigpt.generate(tiny_model, [1], 1, temprature=1.0)
    with pytest.raises(TypeError, match="truncate_prompt"):
        minigpt.generate_batch(tiny_model, [[1]], 1, truncate_prompt=True)


def command(name: str) -> argparse.ArgumentParser:
    return build_parser()._subparsers._group_actions[0].choices[name]


@pytest.mark.parametrize("name, options", [("generate", list(OPTIONS)), ("batch", BATCHED)])
def test_the_command_line_s_flags_are_the_declaration_s(name, options):
    actions = {a.dest: a for a in command(name)._actions if a.option_strings}
    for option in options:
        assert OPTIONS[option].flag in actions[option].option_strings
        assert OPTIONS[option].help in actions[option].help
    assert not set(OPTIONS) - set(options) & set(actions)  # nor an option it does not take


def test_batch_s_keys_and_the_server_s_fields_are_the_declaration_s():
    assert set(BATCHED) <= set(KEYS)
    from minigpt.server.completion_request import FIELDS
    assert {o.field for o in OPTIONS.values() if o.field} <= set(FIELDS)
    assert not [o for o in OPTIONS.values() if o.batched and not o.field]  # every batched option is served


@pytest.mark.parametrize("name", OPTIONS)
def test_a_bad_value_is_an_input_error_carrying_the_option_and_naming_it(tiny_model, name):
    value, words = BAD[name]
    with pytest.raises(InputError) as error:
        minigpt.generate(tiny_model, [1], 4 if name != "max_new_tokens" else value, **(
            {name: value} if name != "max_new_tokens" else {}))
    assert error.value.param == name and name in str(error.value) and words in str(error.value)


def test_a_bad_value_in_generate_batch_names_its_prompt_too(tiny_model):
    with pytest.raises(InputError) as error:
        minigpt.generate_batch(tiny_model, [[1], [2]], 4, presence_penalty=[0, 9])
    assert (error.value.param, error.value.prompt) == ("presence_penalty", 1)
    assert str(error.value) == "prompt 1: presence_penalty must be a number in [-2, 2], got 9"


def test_the_relation_of_two_options_names_both(tiny_model):
    with pytest.raises(InputError, match="min_tokens must be at most max_new_tokens \\(4\\), got 5") as error:
        minigpt.generate(tiny_model, [1], 4, min_tokens=5)
    assert error.value.param == "min_tokens"


CLI_BAD = [("--top-k", "0", "must be an integer >= 1, got 0"), ("--top-k", "2.5", "got '2.5'"),
           ("--presence-penalty", "3", "must be a number in [-2, 2], got 3"),
           ("--repetition-penalty", "0", "must be a number in [1e-100, 1e100], got 0"),
           ("--logit-bias", "5=101", "gives token 5 the bias 101.0"),
           ("--logit-bias", "x=1", "has the key 'x'"), ("--min-tokens", "-1", "must be an integer >= 0")]


@pytest.mark.parametrize("flag, value, words", CLI_BAD)
@pytest.mark.parametrize("name", ["generate", "batch"])
def test_the_command_line_names_a_bad_value_by_its_flag_before_any_work(capsys, monkeypatch, tmp_path, name, flag,
                                                                         value, words):
    monkeypatch.setattr(f"minigpt.cli.{name}.load_model", lambda args: pytest.fail("the model was loaded"))
    argv = ["hi"] if name == "generate" else [str(tmp_path / "missing.jsonl")]
    code, out, err = cli(capsys, *argv, "--model", "random-tiny", "--temperature", "1", flag, value, command=name)
    assert (code, out) == (2, "") and err.startswith(f"error: argument {flag}: ") and words in err, err


def test_the_command_line_names_both_flags_of_a_relation(capsys):
    code, _, err = cli(capsys, "hi", "--model", "random-tiny", "--min-tokens", "50", "--max-new-tokens", "4")
    assert (code, err) == (2, "error: argument --min-tokens: must be at most --max-new-tokens (4), got 50\n")


def test_the_command_line_names_a_value_the_model_refuses_by_its_flag(capsys):
    code, _, err = cli(capsys, "hi", "--model", "random-tiny", "--logit-bias", "99999=1")
    assert (code, err) == (2, "error: argument --logit-bias: has the token id 99999, outside the vocabulary "
                              "[0, 50257)\n")


def test_a_batch_line_names_a_bad_value_by_its_key(capsys, tmp_path):
    code, _, err = batch(capsys, tmp_path, [{"prompt": "a"}, {"prompt": "b", "min_tokens": 9}], "random-tiny",
                         "--max-new-tokens", "4")
    assert (code, err) == (2, f"error: {tmp_path / 'in.jsonl'} line 2: min_tokens must be at most max_new_tokens "
                              "(4), got 9\n")
    code, _, err = batch(capsys, tmp_path, [{"prompt": "b", "logit_bias": {"dog": 1}}], "random-tiny")
    assert code == 2 and "line 1: logit_bias has the key 'dog': a token id is an integer >= 0" in err


def test_a_batch_line_too_long_for_the_pool_names_the_pool_s_flag(capsys, tmp_path):
    code, _, err = batch(capsys, tmp_path, [{"prompt": "a"}, {"prompt_ids": list(range(30))}], "random-tiny",
                         "--kv-cache-tokens", "32", "--max-new-tokens", "5")
    assert code == 2 and f"{tmp_path / 'in.jsonl'} line 2: 30 prompt tokens + 5 new tokens" in err
    assert err.rstrip().endswith("(--kv-cache-tokens)")


def test_a_message_is_rendered_from_its_fields_never_rewritten():
    error = InputError("{top_k} must be at most {max_new_tokens}, got {value}", "top_k", value="'{top_k}'")
    assert str(error) == "top_k must be at most max_new_tokens, got '{top_k}'"  # a value is shown as it is
    assert error.message(lambda k: f"--{k}") == "--top_k must be at most --max_new_tokens, got '{top_k}'"
    assert error.message(str, subject=False) == "must be at most max_new_tokens, got '{top_k}'"
    assert json.dumps(str(InputError("a {brace} kept", None))) == '"a {brace} kept"'  # no param: no template
