"""logit_bias's keys are the token ids they name, one key per token, in every interface: "05" and "5"
name token 5, so giving both is refused as a body's duplicate keys are (never one silently winning);
a key of thousands of digits (beyond Python's limit on converting digit strings) is an error naming
the option, never a traceback or a 500; any other text is no token id."""

from __future__ import annotations

import json

import pytest

from commands import run

import minigpt
from minigpt.errors import InputError
from minigpt.requests.request import check_options
from minigpt.requests.token_keys import from_json

HUGE = "1" * 5000  # int() of it raises ValueError (Python's 4,300-digit limit)
CASES = [  # keys, a phrase of the error
    (["05", "5"], "names token 5 twice, as '05' and '5'"),
    (["0005", "000005"], "names token 5 twice"),
    ([HUGE], "a number of 5,000 digits: no vocabulary has such a token id"),
    (["0" * 5000 + "7", "7"], "names token 7 twice"),
    (["٥"], "has the key '٥': a token id is an integer >= 0"),  # a decimal digit, not ASCII
    (["5_0"], "has the key '5_0': a token id is an integer >= 0"),  # int() would read 50
    ([" 5"], "has the key ' 5': a token id is an integer >= 0"),
]


def test_keys_with_leading_zeros_name_the_token_their_digits_do(tiny_model):
    assert from_json("logit_bias", {"0011": 100, "00": -1}) == {11: 100, 0: -1}
    assert minigpt.generate(tiny_model, [1, 2], 3, **{"logit_bias": from_json("logit_bias", {"0011": 100})}).tokens \
        == [11] * 3


@pytest.mark.parametrize("keys, words", CASES)
def test_a_json_key_that_is_no_single_token_id_is_an_error_naming_logit_bias(keys, words):
    with pytest.raises(InputError) as raised:
        check_options({"logit_bias": from_json("logit_bias", {key: 1 for key in keys})})
    assert raised.value.param == "logit_bias" and words in str(raised.value) and len(str(raised.value)) < 300


@pytest.mark.parametrize("keys, words", CASES)
def test_the_command_line_s_logit_bias_flags_are_read_as_json_s_keys_are(capsys, keys, words):
    argv = [arg for key in keys for arg in ("--logit-bias", f"{key}=1")]
    code, _, err = run(capsys, "generate", "hi", "--model", "random-tiny", "--max-new-tokens", "1", *argv)
    assert code == 2 and err.startswith("error: argument --logit-bias: ") and words in err and "Traceback" not in err


def test_the_same_token_twice_on_the_command_line_is_refused_not_the_last_winning(capsys):
    code, _, err = run(capsys, "generate", "hi", "--model", "random-tiny", "--logit-bias", "11=5", "--logit-bias", "11=-5")
    assert code == 2 and "names token 11 twice" in err


@pytest.mark.parametrize("keys, words", CASES[:3])
def test_a_batch_line_s_logit_bias_keys_are_refused_naming_the_line(capsys, tmp_path, keys, words):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text(json.dumps({"prompt": "hi", "logit_bias": {key: 1 for key in keys}}) + "\n")
    code, _, err = run(capsys, "batch", str(source), "-o", str(target), "--model", "random-tiny")
    assert code == 2 and "line 1: logit_bias " in err and words in err and not target.exists()


def test_an_api_key_too_long_to_print_is_refused_naming_its_size(tiny_model):
    with pytest.raises(InputError, match="the token id an integer of about 5,000 digits, outside the vocabulary"):
        minigpt.generate(tiny_model, [1], 1, logit_bias={10 ** 5000: 1})


@pytest.mark.parametrize("keys, words", CASES[:4])
def test_the_server_answers_a_400_naming_logit_bias(keys, words, tiny_model, tokenizer):
    pytest.importorskip("starlette", reason="the serve extra is not installed (pip install -e '.[serve]')")
    from serving import post, running_server
    with running_server(tiny_model) as (_, url):
        raw = "{" + ", ".join(f'"{key}": 1' for key in keys) + "}"
        status, _, body = post(url, "/v1/completions", None, raw=f'{{"prompt": "hi", "max_tokens": 1, '
                                                                 f'"logit_bias": {raw}}}'.encode())
    assert status == 400 and body["error"]["param"] == "logit_bias" and words in body["error"]["message"]
