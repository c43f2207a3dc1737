"""Hostile inputs and faults through the CLI: one line `error: ...` on stderr, a non-zero exit, no traceback.

The rows of docs/loading.md, as a user meets them with `python -m minigpt generate`: 1 for a fault,
2 for a usage error, 130 for Ctrl-C. Most run `minigpt.cli.main` in-process (fast); a few run the
real `python -m minigpt` in a subprocess, as a user does. The broken checkpoints (tests/checkpoints.py)
are the ones test_api_errors.py loads through the API.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
from commands import REPO, assert_error, cli, environment
from checkpoints import ALIASES, BROKEN_CHECKPOINTS, EOT, TINY, ReadError, make_checkpoint, only_a_pickle

import minigpt
import minigpt.cli.generate
from minigpt.loading.checkpoint_writer import save_checkpoint
from minigpt.cli import main
from minigpt.loading.weights import params_from_tensors, params_to_tensors, random_params

@pytest.fixture(autouse=True)
def bpe_tables(tokenizer):
    """Every command here tokenizes: the packaged tables, checked once for the module."""


def run(tmp_path: Path, *argv: str) -> tuple[int, str, str]:
    """The real `python -m minigpt generate ARGV` in a subprocess: exit code, stdout, stderr."""
    done = subprocess.run([sys.executable, "-m", "minigpt", "generate", *argv], capture_output=True,
                          text=True, env=environment(tmp_path / "hf"), timeout=120)
    return done.returncode, done.stdout, done.stderr


# Model sources

def test_a_missing_path_is_named_with_the_known_aliases(capsys, tmp_path):
    missing = str(tmp_path / "no-such-dir")
    assert_error(cli(capsys, "hi", "--model", missing), [missing, *ALIASES])


def test_a_typo_in_an_alias_suggests_it(tmp_path):
    assert_error(run(tmp_path, "hi", "--model", "gtp2"), ["'gtp2'", "did you mean 'gpt2'", *ALIASES])


def test_an_uncached_hub_model_offline_says_so_and_what_to_do(tmp_path):
    assert_error(run(tmp_path, "hi", "--model", "gpt2"),
                 ["'openai-community/gpt2'", "offline", "local checkpoint directory", "random-124m"])


def test_an_interrupted_download_is_one_line_even_if_the_cause_is_not(capsys, monkeypatch):
    def interrupted(repo_id, **_):
        raise ReadError("connection reset\nby peer")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", interrupted)
    assert_error(cli(capsys, "hi", "--model", "distilgpt2"), ["'distilbert/distilgpt2'", "ReadError", "resume"])


# Checkpoints

@pytest.mark.parametrize("breaks, error", BROKEN_CHECKPOINTS)
def test_a_broken_checkpoint_is_one_line_naming_the_fault(capsys, tmp_path, breaks, error):
    names = breaks(make_checkpoint(tmp_path))
    assert_error(cli(capsys, "hi", "--model", str(tmp_path)), names)


def test_a_pickle_checkpoint_is_refused_unopened_by_the_real_command(tmp_path):
    directory = make_checkpoint(tmp_path / "ckpt")
    names = only_a_pickle(directory)
    assert_error(run(tmp_path, "hi", "--model", str(directory)), names)
    assert not (directory / "unpickled").exists(), "a pickle was unpickled"


# Options

@pytest.mark.parametrize("option, value", [
    ("--temperature", "-1"), ("--temperature", "nan"), ("--temperature", "inf"), ("--top-p", "0"),
    ("--top-p", "1.5"), ("--top-k", "0"), ("--top-k", "2.5"), ("--max-new-tokens", "-1"), ("--seed", "-1"),
    ("--kernels", "fastest"), ("--top-logprobs", "-1"), ("--top-logprobs", "21"),
    ("--top-logprobs", "99999999999999999999"), ("--draft-tokens", "0"),
])
def test_a_bad_option_is_a_usage_error_naming_it(capsys, option, value):
    assert_error(cli(capsys, "hi", "--model", "random-tiny", option, value), [f"argument {option}", value],
                 exit_code=2)


@pytest.mark.parametrize("option, value", [
    ("--max-batch-size", "0"), ("--kv-cache-tokens", "0"), ("--kv-cache-tokens", "1e3"), ("--top-logprobs", "-1"),
    ("--top-logprobs", "99999999999999999999"),
    ("--temperature", "nan"), ("--top-p", "0"), ("--max-new-tokens", "-1"), ("--seed", "x"),
])
def test_a_bad_batch_option_is_a_usage_error_naming_it(capsys, tmp_path, option, value):
    """`batch` validates its options as `generate` does (the same parsers), before reading INPUT."""
    try:
        code = main(["batch", str(tmp_path / "missing.jsonl"), "--model", "random-tiny", option, value])
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    assert_error((code, out, err), [f"argument {option}", value], exit_code=2)


@pytest.mark.parametrize("argv, option, needed", [
    (["--top-logprobs", "3"], "--top-logprobs", "--json"),
    (["--top-logprobs", "0"], "--top-logprobs", "--json"),
    (["--draft-tokens", "3"], "--draft-tokens", "--speculate"),
    (["--draft-tokens", "3", "--json"], "--draft-tokens", "--speculate"),
    (["--seed", "1"], "--seed", "--temperature above 0"),
    (["--top-k", "5", "--temperature", "0"], "--top-k", "--temperature above 0"),
    (["--top-p", "0.5", "--speculate", "ngram"], "--top-p", "--temperature above 0"),
])
def test_an_option_without_the_one_it_needs_is_a_usage_error_saying_so(capsys, monkeypatch, argv, option, needed):
    monkeypatch.setattr(minigpt.cli.generate, "load_model", lambda args: pytest.fail("the model was loaded"))
    assert_error(cli(capsys, "hi", "--model", "random-tiny", *argv),
                 [f"argument {option}: has no effect without {needed}"], exit_code=2)


def test_prompt_plus_new_tokens_beyond_the_context_is_refused_stating_the_limit(capsys):
    assert_error(cli(capsys, "hi " * 10, "--model", "random-tiny", "--max-new-tokens", "250"),
                 ["tokens + 250 new tokens", "256 (n_positions)", "--truncate-prompt"])
    assert_error(cli(capsys, "hi", "--model", "random-tiny", "--max-new-tokens", "300"),
                 ["300 new tokens", "256 (n_positions)"])


def test_speculation_without_the_cache_is_a_usage_error(capsys):
    assert_error(cli(capsys, "hi", "--model", "random-tiny", "--speculate", "ngram", "--no-cache"),
                 ["--no-cache", "not allowed with", "--speculate"], exit_code=2)


def test_a_draft_model_that_cannot_be_loaded_is_named_as_speculate_not_model(capsys, tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("{}\n")
    assert_error(cli(capsys, "hi", "--model", "random-tiny", "--speculate", str(prompts)),
                 [f"--speculate: {prompts} is a file, not a checkpoint directory"])
    code, out, err = cli(capsys, "hi", "--model", "random-tiny", "--speculate", "no-such-draft")
    assert err.startswith("error: --speculate: no directory 'no-such-draft'") and "--model" not in err


def test_a_draft_model_with_another_vocabulary_is_refused(capsys):
    draft = str(REPO / "tests" / "fixtures" / "float32")
    assert_error(cli(capsys, "hi", "--model", "random-tiny", "--speculate", draft),
                 ["argument --speculate: the draft model's vocabulary has 384 tokens", "50257"], exit_code=2)


@pytest.mark.parametrize("stop, names", [("", ["must not hold an empty string"]),
                                         ("\udcff", ["holds '\\udcff'", "not valid Unicode"])])
def test_a_bad_stop_string_is_refused(capsys, stop, names):
    assert_error(cli(capsys, "hi", "--model", "random-tiny", "--stop", stop), ["argument --stop: ", *names],
                 exit_code=2)


def generate_json(capsys, *argv: str) -> dict:
    code, out, err = cli(capsys, *argv, "--model", "random-tiny", "--json")
    assert code == 0 and err == "", err
    return json.loads(out)


def test_truncate_prompt_keeps_the_last_tokens(capsys, tokenizer):
    prompt = " ".join(f"word{i}" for i in range(200))
    result = generate_json(capsys, prompt, "--max-new-tokens", "6", "--truncate-prompt")
    assert result["prompt_ids"] == minigpt.encode(tokenizer, prompt)[-251:]  # 251 + 6 - 1 = 256 positions


# Text

def test_an_empty_prompt_starts_from_endoftext(capsys):
    assert generate_json(capsys, "", "--max-new-tokens", "2")["prompt_ids"] == [EOT]


@pytest.mark.parametrize("prompt", ["<|endoftext|>", "naïve café 😀 <|endoftext|> 中文 \u200b\x00"])
def test_a_literal_endoftext_is_its_token_and_any_unicode_is_text(capsys, tokenizer, prompt):
    result = generate_json(capsys, prompt, "--max-new-tokens", "2")
    assert result["prompt_ids"] == minigpt.encode(tokenizer, prompt) and EOT in result["prompt_ids"]
    assert tokenizer.decode(result["prompt_ids"]) == prompt
    code, out, err = cli(capsys, prompt, "--model", "random-tiny", "--max-new-tokens", "2")
    assert code == 0 and out.startswith(prompt) and err == ""


# score

def score(capsys, *argv: str) -> tuple[int, str, str]:
    return cli(capsys, *argv, command="score")


@pytest.mark.parametrize("argv, names", [
    ((), ["one of the arguments TEXT --file is required"]),
    (("hi", "--file", "x.txt"), ["argument --file: not allowed with argument TEXT"]),
    (("hi", "--stride", "0"), ["argument --stride", "must be >= 1, got 0"]),
])
def test_score_usage_errors(capsys, argv, names):
    assert_error(score(capsys, *argv, "--model", "random-tiny"), names, exit_code=2)


def test_score_refuses_what_it_cannot_score(capsys, tmp_path):
    assert_error(score(capsys, "", "--model", "random-tiny"), ["at least 2 tokens", "got 0"])
    assert_error(score(capsys, "Hello", "--model", "random-tiny"), ["at least 2 tokens", "got 1"])
    assert_error(score(capsys, "a b c", "--model", "random-tiny", "--stride", "257"),
                 ["argument --stride: must be an integer in 1..256, got 257"], exit_code=2)
    missing, latin1 = tmp_path / "missing.txt", tmp_path / "latin1.txt"
    latin1.write_bytes("café".encode("latin-1"))
    assert_error(score(capsys, "--file", str(missing), "--model", "random-tiny"),
                 [f"cannot read --file '{missing}'", "No such file"], exit_code=2)
    assert_error(score(capsys, "--file", str(tmp_path), "--model", "random-tiny"), ["cannot read --file"],
                 exit_code=2)
    assert_error(score(capsys, "--file", str(latin1), "--model", "random-tiny"),
                 [f"--file '{latin1}' is not UTF-8 text", "byte 4 is 0xe9"], exit_code=2)  # from 1, as batch


# Ctrl-C

@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT cannot be sent to one process on Windows")
def test_ctrl_c_exits_130_without_a_traceback_keeping_the_text_printed(tmp_path):
    long_context = make_checkpoint(tmp_path / "ckpt", dataclasses.replace(TINY, n_positions=4096))
    prompt = "Once upon a time"
    stdout = tmp_path / "stdout"
    with open(stdout, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "minigpt", "generate", prompt, "--model", str(long_context),
             "--max-new-tokens", "4000", "--no-stop"],
            stdout=out, stderr=subprocess.PIPE, env=environment(tmp_path / "hf"),
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # even if our SIGINT is ignored
        )
        deadline = time.monotonic() + 60
        while stdout.stat().st_size < len(prompt) + 10:  # the echoed prompt and some generated text
            assert process.poll() is None, f"ended before the signal: {process.stderr.read()!r}"
            assert time.monotonic() < deadline, "no generated text within 60 s"
            time.sleep(0.02)
        printed = stdout.read_bytes()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert b"Traceback" not in err and b"error" not in err
    assert printed.startswith(prompt.encode())
    assert stdout.read_bytes().startswith(printed)


@pytest.mark.parametrize("command, argv, echoed", [
    ("prove", ["--prompt", "The dog", "--json", "--steps", "2"], ""),
    ("generate", ["The dog", "--json", "--max-new-tokens", "2"], ""),
    ("generate", ["The dog", "--temperature", "1", "--max-new-tokens", "2"], "The dog"),
    ("score", ["The dog"], ""),
], ids=["prove-json", "generate-json", "generate-sampled-text", "score"])
def test_huge_finite_weights_are_one_error_line_never_nan_or_garbage(capsys, tmp_path, command, argv, echoed):
    """Every weight x1e30 overflows float32 in block 0: one error naming it; on stdout no NaN, no token,
    only the prompt that streamed text echoes before its first step."""
    params = random_params(TINY, seed=1)
    tensors = {name: value * np.float32(1e30) for name, value in params_to_tensors(params).items()}
    save_checkpoint(tmp_path, TINY, params_from_tensors(TINY, tensors))
    code, out, err = cli(capsys, *argv, "--model", str(tmp_path), command=command)
    assert_error((code, out.removeprefix(echoed), err), ["not finite", "after block 0 (h.0)"])


def test_a_perplexity_beyond_float64_is_null_in_json_and_inf_in_the_table(capsys, tmp_path):
    """Weights x100 stay finite, but give tokens log-probabilities of about -2000 nats: exp(2000)
    is no float64, and JSON has no Infinity. The document stays valid JSON."""
    params = random_params(TINY, seed=1)
    tensors = {name: value * np.float32(100) for name, value in params_to_tensors(params).items()}
    save_checkpoint(tmp_path, TINY, params_from_tensors(TINY, tensors))
    code, out, err = cli(capsys, "The dog ran", "--model", str(tmp_path), "--json", command="score")
    assert code == 0, err
    document = json.loads(out, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))
    assert document["perplexity"] is None and document["mean_logprob"] < -709
    code, out, err = cli(capsys, "The dog ran", "--model", str(tmp_path), command="score")
    assert code == 0 and "perplexity            inf (beyond float64)" in out
