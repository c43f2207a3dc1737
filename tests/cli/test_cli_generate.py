"""Scripted generation end to end, with GPT-2's real tokenizer: stop strings through the API, `stream`
and the CLI (`--stop`), and `generate --json`: every option and result recorded, its text without
the <|endoftext|> that ended it, its prompt valid UTF-8 whatever bytes the command line held.

The model is the embedded random-tiny: its next-token distribution is nearly uniform over GPT-2's
vocabulary, so a seeded sample holds tokens of every kind, pieces of multi-byte characters among them.
"""

from __future__ import annotations

import codecs
import json
import subprocess
import sys

import numpy as np
import pytest
from checkpoints import EOT, TINY
from commands import cli, environment

import minigpt
from minigpt.requests.request import OPTIONS
from minigpt.loading.checkpoint_writer import save_checkpoint
from minigpt.loading.weights import params_from_tensors, params_to_tensors, random_params

PROMPT = "The dog"
SAMPLED = dict(temperature=1.0, seed=0, stop_at_eos=False)  # 40 tokens of random-tiny, seed 0
SAMPLED_ARGS = ("--temperature", "1", "--seed", "0", "--no-stop", "--max-new-tokens", "40")


@pytest.fixture(scope="module")
def unstopped(tiny_model, tokenizer):
    """The sampled run without stop strings, and its tokens' bytes."""
    result = minigpt.generate(tiny_model, minigpt.encode(tokenizer, PROMPT), 40, **SAMPLED)
    return result, [tokenizer.decode_single_token_bytes(t) for t in result.tokens]


def expected(pieces: list[bytes], stop: str) -> tuple[int, str]:
    """The specification (OpenAI, vLLM, Hugging Face, lm-eval): the tokens up to and including the one
    that completes the stop string's first occurrence, and the text before that occurrence."""
    data = b"".join(pieces)
    at = data.find(stop.encode())
    assert at >= 0, f"{stop!r} is not in the text"
    ends = np.cumsum([len(p) for p in pieces]).tolist()
    return next(k + 1 for k, end in enumerate(ends) if end >= at + len(stop.encode())), \
        data[:at].decode("utf-8", errors="replace")


def ends_inside_a_character(data: bytes) -> bool:
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    decoder.decode(data)
    return bool(decoder.getstate()[0])  # bytes of a character not complete yet


def check_stop(capsys, model, unstopped, stop: str) -> tuple[int, str]:
    """Generate with `stop` through the API, `stream` and the CLI (JSON and streamed text); each
    ends where the specification says. Returns the tokens kept and the text."""
    full, pieces = unstopped
    k, text = expected(pieces, stop)
    ids = minigpt.encode(model.tokenizer, PROMPT)
    result = minigpt.generate(model, ids, 40, stop=[stop], **SAMPLED)
    assert result.finish_reason == "stop"
    assert result.tokens == full.tokens[:k] and result.logprobs == full.logprobs[:k]
    assert result.text == text and stop not in text
    streamed = list(minigpt.stream(model, ids, 40, stop=[stop], **SAMPLED))
    assert [t.token for t in streamed] == result.tokens and "".join(t.text for t in streamed) == text

    code, out, err = cli(capsys, PROMPT, "--model", "random-tiny", *SAMPLED_ARGS, "--stop", "no such text",
                         "--stop", stop, "--json")
    assert code == 0 and err == "", err
    document = json.loads(out)
    assert (document["tokens"], document["text"], document["finish_reason"]) == (result.tokens, text, "stop")
    code, out, err = cli(capsys, PROMPT, "--model", "random-tiny", *SAMPLED_ARGS, "--stop", stop)
    assert code == 0 and out == PROMPT + text + "\n", err
    return k, text


def test_a_stop_string_across_tokens_keeps_the_text_before_it_of_the_token_it_begins_in(capsys, tiny_model,
                                                                                       unstopped):
    """A stop string made of the end of one token and the start of the next: that first token
    straddles the boundary and gives its text before the stop string; the next token completes it."""
    _, pieces = unstopped
    j = next(j for j in range(1, len(pieces) - 1)
             if all(p.isascii() and len(p.strip()) >= 3 for p in pieces[j:j + 2]))
    stop = (pieces[j][-2:] + pieces[j + 1][:2]).decode()
    k, text = check_stop(capsys, tiny_model, unstopped, stop)
    assert k == j + 2 and text.endswith(pieces[j][:-2].decode())


def test_a_stop_string_after_half_a_character_leaves_the_replacement_character(capsys, tiny_model, unstopped):
    """A token that ends with the first bytes of a multi-byte character, then a stop string in the
    next token: the character is never completed, so the text ends with U+FFFD, as decoding the bytes
    before the stop string gives."""
    _, pieces = unstopped
    j = next(j for j in range(len(pieces) - 1)
             if ends_inside_a_character(b"".join(pieces[:j + 1])) and pieces[j + 1][:3].isascii())
    stop = pieces[j + 1][:3].decode()
    k, text = check_stop(capsys, tiny_model, unstopped, stop)
    assert k == j + 2 and text.endswith("\ufffd")


# ------------------------------------------------------------------ --json

KEYS = {"model", "kernels", "use_cache", *(set(OPTIONS) - {"top_logprobs"}), "speculate", "finish_reason", "prompt",
        "prompt_ids", "tokens", "text", "logprobs", "step_ms"}  # every request option but top_logprobs (the lists)
SPECULATION_KEYS = {"draft_tokens", "drafted", "accepted"}


def generate_json(capsys, *argv: str) -> dict:
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 0 and err == "", err
    return json.loads(out)


def test_json_records_every_option_and_the_logprobs(capsys, tiny_model, tokenizer):
    plain = generate_json(capsys, PROMPT, "--model", "random-tiny", "--max-new-tokens", "5", "--top-k", "7",
                          "--top-p", "0.5", "--seed", "3", "--temperature", "0.7", "--stop", "x", "--stop", "\n\n")
    assert set(plain) == KEYS
    assert {k: plain[k] for k in ("model", "kernels", "use_cache", "temperature", "top_k", "top_p", "seed",
                                  "max_new_tokens", "stop", "stop_at_eos", "truncate_prompt", "speculate")} == {
        "model": "random-tiny", "kernels": "exact", "use_cache": True, "temperature": 0.7, "top_k": 7,
        "top_p": 0.5, "seed": 3, "max_new_tokens": 5, "stop": ["x", "\n\n"], "stop_at_eos": True,
        "truncate_prompt": False, "speculate": None}
    assert {k: plain[k] for k in ("logit_bias", "presence_penalty", "frequency_penalty", "repetition_penalty",
                                  "min_tokens")} == {"logit_bias": {}, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                                                     "repetition_penalty": 1.0, "min_tokens": 0}
    result = minigpt.generate(tiny_model, minigpt.encode(tokenizer, PROMPT), 5, top_k=7, top_p=0.5, seed=3,
                              temperature=0.7, stop=["x", "\n\n"])
    assert (plain["prompt_ids"], plain["tokens"], plain["logprobs"], plain["finish_reason"]) == (
        result.prompt_ids, result.tokens, result.logprobs, result.finish_reason)
    assert len(plain["step_ms"]) == len(plain["tokens"])


def test_json_records_top_logprobs_and_speculation_when_asked(capsys, tokenizer):
    plain = generate_json(capsys, PROMPT, "--model", "random-tiny", "--max-new-tokens", "6", "--top-logprobs", "3")
    assert set(plain) == KEYS | {"top_logprobs"}
    assert len(plain["top_logprobs"]) == len(plain["tokens"])
    for token, logprob, top in zip(plain["tokens"], plain["logprobs"], plain["top_logprobs"]):
        assert [set(entry) for entry in top] == [{"id", "token", "logprob"}] * 3
        assert top[0] == {"id": token, "token": tokenizer.decode([token]), "logprob": logprob}  # greedy: the best
        assert top[0]["logprob"] >= top[1]["logprob"] >= top[2]["logprob"]
    speculative = generate_json(capsys, PROMPT, "--model", "random-tiny", "--max-new-tokens", "6",
                                "--speculate", "random-tiny", "--draft-tokens", "3")
    assert set(speculative) == KEYS | SPECULATION_KEYS
    assert (speculative["speculate"], speculative["draft_tokens"]) == ("random-tiny", 3)
    assert speculative["accepted"] == speculative["drafted"] > 0  # the model as its own draft
    assert speculative["tokens"] == plain["tokens"] and speculative["logprobs"] == plain["logprobs"]


def ends_early(directory):
    """A GPT-2-vocabulary checkpoint that ends its text often: the final LayerNorm outputs its bias,
    all ones, so <|endoftext|> (its embedding 1.25 everywhere, logit 10) has probability ~0.3 a step."""
    tensors = params_to_tensors(random_params(TINY, seed=1))
    tensors["ln_f.weight"][:] = 0
    tensors["ln_f.bias"][:] = 1
    tensors["wte.weight"][EOT] = 1.25
    save_checkpoint(directory, TINY, params_from_tensors(TINY, tensors))
    return directory


def test_json_text_leaves_out_the_end_of_text_that_ended_it(capsys, tmp_path, tokenizer):
    document = generate_json(capsys, "Once", "--model", str(ends_early(tmp_path)), "--temperature", "1",
                             "--seed", "0", "--max-new-tokens", "30")
    tokens = document["tokens"]
    assert document["finish_reason"] == "eos" and tokens[-1] == EOT and len(tokens) >= 2, tokens
    assert document["text"] == tokenizer.decode(tokens[:-1]) and "<|endoftext|>" not in document["text"]


def test_streamed_text_leaves_out_the_end_of_text_that_ended_it(capsys, tmp_path, tokenizer):
    args = ["Once", "--model", str(ends_early(tmp_path)), "--temperature", "1", "--seed", "0", "--max-new-tokens", "30"]
    document = generate_json(capsys, *args)
    code, streamed, err = cli(capsys, *args)
    assert code == 0 and document["finish_reason"] == "eos" and streamed == "Once" + document["text"] + "\n"


@pytest.mark.skipif(sys.platform == "win32", reason="Windows command lines are text, not bytes")
def test_a_prompt_with_undecodable_bytes_is_replaced_in_the_json_and_kept_in_the_ids(tmp_path, tokenizer):
    """Bytes that are not UTF-8 in the real command line: `prompt` shows U+FFFD, `prompt_ids` are
    the bytes given, the streamed echo is valid UTF-8; no traceback."""
    raw = b"caf\xe9 \xe4\xb8 ok"  # Latin-1 "é", then a cut "中"
    argv = [sys.executable, "-m", "minigpt", "generate", raw, "--model", "random-tiny", "--max-new-tokens", "3"]
    runs = [subprocess.run(argv + extra, capture_output=True, env=environment(tmp_path / "hf"), timeout=120)
            for extra in (["--json"], [])]
    for run in runs:
        assert run.returncode == 0 and run.stderr == b"", run.stderr.decode(errors="replace")
    document = json.loads(runs[0].stdout.decode("utf-8"))
    assert document["prompt"] == "caf\ufffd \ufffd ok"
    assert tokenizer.decode_bytes(document["prompt_ids"]) == raw
    streamed = runs[1].stdout.decode("utf-8")  # strict: must be valid UTF-8
    assert streamed == "caf\ufffd \ufffd ok" + document["text"] + "\n"
