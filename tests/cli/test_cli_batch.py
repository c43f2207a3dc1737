"""`python -m minigpt batch`: JSON Lines in, one line per prompt out, in input order, each line's
tokens those `minigpt.generate` gives it alone; every bad line refused before any work.

Most tests run `minigpt.cli.main` in-process on a small checkpoint whose vocabulary is not GPT-2's
(so no BPE tables are needed; its "text" is null); the text tests and the subprocess tests (stdin,
stdout, Ctrl-C) use random-tiny and GPT-2's tokenizer.
"""

from __future__ import annotations

import codecs
import io
import json
import os
import re
import signal
import struct
import subprocess
import sys
import threading
import time

import pytest
from commands import batch, environment, write_lines

import minigpt
import minigpt.api.api
import minigpt.cli.batch
import minigpt.engine.scheduler
from minigpt.loading.checkpoint_writer import save_checkpoint
from minigpt.cli import main
from minigpt.gpt2.config import GPT2Config
from minigpt.loading.weights import random_params

SMALL = GPT2Config(vocab_size=300, n_positions=64, n_embd=16, n_layer=2, n_head=2, eos_token_id=None)
SUMMARY = re.compile(r"(\d+) requests, ([\d,]+) tokens, ([\d.]+) s, ([\d,.]+) tokens/s, peak ([\d,]+) of ([\d,]+) "
                     r"pages in use \(([\d,.]+ (?:B|KiB|MiB|GiB)) of keys and values\), (\d+) preemptions, "
                     r"([\d,]+) prompt tokens from the prefix cache\n")


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> str:
    """A checkpoint directory with a 300-token vocabulary: no tokenizer, so prompt_ids only."""
    directory = tmp_path_factory.mktemp("small")
    save_checkpoint(directory, SMALL, random_params(SMALL, seed=1, scale=20.0))  # scaled: varied greedy tokens
    return str(directory)


@pytest.fixture(scope="module")
def small_model(small):
    return minigpt.load(small)


def alone(model, line: dict, **defaults) -> minigpt.GenerationResult:
    """What minigpt.generate gives the line's prompt with the line's options over the defaults."""
    options = {**defaults, **{k: v for k, v in line.items() if k not in ("id", "prompt_ids")}}
    return minigpt.generate(model, line["prompt_ids"], **options)


def assert_same(output: dict, result: minigpt.GenerationResult) -> None:
    assert output["prompt_ids"] == result.prompt_ids
    assert output["tokens"] == result.tokens
    assert output["logprobs"] == result.logprobs  # bitwise: JSON keeps every bit of a float
    assert output["finish_reason"] == result.finish_reason
    if result.top_logprobs is None:
        assert "top_logprobs" not in output
    else:
        assert [[(entry["id"], entry["logprob"]) for entry in step] for step in output["top_logprobs"]] == \
            result.top_logprobs  # as {"id", "token", "logprob"} objects, as generate --json writes them


# Order, ids, exactness

def test_lines_come_out_in_input_order_although_later_ones_finish_first(capsys, tmp_path, small, small_model):
    lines = [{"prompt_ids": [1, 2, 3], "max_new_tokens": 12}, {"prompt_ids": [4], "max_new_tokens": 2},
             {"prompt_ids": [5, 6], "max_new_tokens": 6}]
    requests = minigpt.requests.request.make_requests(small_model, [line["prompt_ids"] for line in lines], dict(
        max_new_tokens=[line["max_new_tokens"] for line in lines], temperature=0.0, top_k=None, top_p=None,
        seed=None, stop=None, stop_at_eos=True, top_logprobs=0))
    engine = minigpt.api.api.Engine(small_model, max_batch_size=16)
    assert [i for i, _ in engine.results(engine.jobs_for(requests))] == [1, 2, 0]  # the premise
    code, outputs, err = batch(capsys, tmp_path, lines, small)
    assert code == 0, err
    assert [o["id"] for o in outputs] == [1, 2, 3]
    assert [len(o["tokens"]) for o in outputs] == [12, 2, 6]


def test_ids_are_copied_and_default_to_line_numbers_counting_blank_lines(capsys, tmp_path, small):
    lines = [{"prompt_ids": [1]}, "", {"id": "a", "prompt_ids": [1]}, "   ", {"id": 7, "prompt_ids": [1]},
             {"id": None, "prompt_ids": [1]}, {"id": True, "prompt_ids": [1]}, {"id": 2.5, "prompt_ids": [1]},
             {"prompt_ids": [1]}]
    code, outputs, err = batch(capsys, tmp_path, lines, small, "--max-new-tokens", "1")
    assert code == 0, err
    assert [o["id"] for o in outputs] == [1, "a", 7, None, True, 2.5, 9]


def test_every_line_gets_the_tokens_generate_gives_it_alone_with_its_own_options(capsys, tmp_path, small,
                                                                                 small_model):
    defaults = dict(max_new_tokens=7, temperature=0.9, top_k=40, seed=3)
    lines = [
        {"prompt_ids": [1, 2, 3]},
        {"prompt_ids": [4, 5], "temperature": 0.0, "max_new_tokens": 3},  # greedy, shorter
        {"prompt_ids": [6], "top_k": None, "top_p": 0.9, "seed": 11},  # the option turned off, another one on
        {"prompt_ids": [7, 8, 9, 10], "seed": None, "top_logprobs": 3},  # unseeded: only its length is fixed
        {"prompt_ids": [2], "max_new_tokens": 0},
        {"prompt_ids": [1, 2, 3], "temperature": 1.5, "seed": 3, "max_new_tokens": 20},
    ]
    code, outputs, err = batch(capsys, tmp_path, lines, small, "--max-new-tokens", "7", "--temperature", "0.9",
                               "--top-k", "40", "--seed", "3", "--max-batch-size", "4")
    assert code == 0, err
    assert [len(o["tokens"]) for o in outputs] == [7, 3, 7, 7, 0, 20]
    for i in (0, 1, 2, 4, 5):
        assert_same(outputs[i], alone(small_model, lines[i], **defaults))
    assert outputs[0]["tokens"] != outputs[5]["tokens"][:7]  # the overrides changed something
    assert len(outputs[3]["top_logprobs"]) == 7 and all(len(step) == 3 for step in outputs[3]["top_logprobs"])
    assert {entry["token"] for step in outputs[3]["top_logprobs"] for entry in step} == {None}  # no tokenizer
    assert all(o["text"] is None and o["preemptions"] == 0 for o in outputs)  # no tokenizer; an ample pool


def test_a_tight_pool_preempts_and_every_line_still_gets_its_tokens_alone(capsys, tmp_path, small, small_model):
    lines = [{"prompt_ids": list(range(i, i + 20))} for i in (0, 50, 100, 150)]
    code, outputs, err = batch(capsys, tmp_path, lines, small, "--max-new-tokens", "30", "--kv-cache-tokens", "64",
                               "--temperature", "1", "--seed", "5")
    assert code == 0, err
    assert sum(o["preemptions"] for o in outputs) > 0
    for line, output in zip(lines, outputs):
        assert_same(output, alone(small_model, line, max_new_tokens=30, temperature=1.0, seed=5))
    assert int(SUMMARY.search(err)[8]) == sum(o["preemptions"] for o in outputs)


def test_each_line_is_written_as_soon_as_it_and_every_line_before_it_are_done(capsys, tmp_path, small, monkeypatch):
    target, real_run, seen = tmp_path / "out.jsonl", minigpt.api.api.Engine.results, []

    def spy(*args, **kwargs):
        for i, result in real_run(*args, **kwargs):
            yield i, result
            seen.append((i, len(target.read_text().splitlines())))  # resumed: the CLI has handled result i

    monkeypatch.setattr(minigpt.api.api.Engine, "results", spy)
    lengths = [9, 3, 1, 6]
    code, outputs, err = batch(capsys, tmp_path, [{"prompt_ids": [1], "max_new_tokens": n} for n in lengths], small)
    assert code == 0, err
    assert seen == [(2, 0), (1, 0), (3, 0), (0, 4)]  # nothing until line 1 is done, then everything at once


def test_the_summary_gives_requests_tokens_time_rate_peak_pages_and_preemptions(capsys, tmp_path, small):
    code, outputs, err = batch(capsys, tmp_path, [{"prompt_ids": [1, 2]}, {"prompt_ids": [3], "max_new_tokens": 5}],
                               small, "--max-new-tokens", "10", "--kv-cache-tokens", "320")
    assert code == 0, err
    summary = SUMMARY.search(err)
    assert summary, err
    requests, tokens, seconds, rate, peak, pages, kv, preemptions, cached = summary.groups()
    assert (int(requests), int(tokens), int(pages), int(preemptions)) == (2, 15, 8, 0)  # 320 asked, 2 contexts used
    assert int(peak) == 2  # 11 and 5 positions: one page each
    assert kv == f"{2 * 2 * 2 * 16 * 16 * 4 / 1024:g} KiB"  # 2 pages x (K, V) x 2 layers x 16 positions x 16 x 4 bytes
    assert float(seconds) >= 0 and float(rate.replace(",", "")) > 0
    assert err.endswith(summary[0]) and "2/2" in err  # the summary last, after the progress bar's final state


def test_an_empty_input_writes_nothing_and_says_so(capsys, tmp_path, small):
    code, outputs, err = batch(capsys, tmp_path, ["", " "], small)
    assert (code, outputs) == (0, [])
    assert SUMMARY.search(err)[1] == "0"


# Bad lines: refused before any work, naming the line

BAD_LINES = [
    ('{"prompt_ids": [1, 2}', [], "invalid JSON: Expecting ',' delimiter at column 21"),
    ("[1, 2]", [], "a line must be a JSON object {...}, got [1, 2]"),
    ('"The dog"', [], "a line must be a JSON object"),
    ({"prompt_ids": [1], "temprature": 0.5}, [], 'unknown key "temprature"; a line\'s keys are id, prompt,'),
    ({"prompt": "a", "prompt_ids": [1]}, [], 'exactly one of "prompt" (text) and "prompt_ids"'),
    ({"id": 3}, [], 'exactly one of "prompt" (text) and "prompt_ids"'),
    ({"prompt_ids": [1], "id": [1]}, [], 'id must be a string, finite number, boolean or null, got [1]'),
    ('{"prompt_ids": [1], "id": NaN}', [], 'id must be a string, finite number, boolean or null, got nan'),
    ('{"prompt_ids": [1], "id": -Infinity}', [], 'id must be a string, finite number, boolean or null, got -inf'),
    ('{"prompt_ids": [1], "prompt_ids": [2]}', [], "invalid JSON: key 'prompt_ids' appears twice in one object"),
    ('{"prompt": "a\x00b"}', [], "invalid JSON: Invalid control character at column 14\n"),
    ('{"prompt_ids": [1], "stop": [{"a": 1, "a": 2}]}', [], "invalid JSON: key 'a' appears twice in one object"),
    ('{"prompt_ids": ' + "[" * 100_000 + "]" * 100_000 + "}", [], "invalid JSON: nested too deeply"),
    ('{"prompt_ids": [1], "seed": ' + "7" * 5000 + "}", [], "invalid JSON: Exceeds the limit (4300 digits)"),
    ({"prompt_ids": [1], "temperature": 10 ** 400}, [], "temperature must be a finite number >= 0, got 1000"),
    ({"prompt": 5}, [], 'prompt must be a string (token ids go in "prompt_ids"), got 5'),
    ({"prompt": "The dog"}, [], "not GPT-2's 50257, so it has no tokenizer for text"),
    ({"prompt_ids": "1 2"}, [], "token ids must be integers, got the text"),
    ({"prompt_ids": [1, 2.0]}, [], "token id at index 1 is 2.0, not an integer"),
    ({"prompt_ids": [1, 300]}, [], "token id 300 at index 1 is outside [0, 300)"),
    ({"prompt_ids": [[1]]}, [], "token ids must be a 1-D sequence"),
    ({"prompt_ids": [1], "max_new_tokens": "5"}, [], "max_new_tokens must be an integer >= 0, got '5'"),
    ({"prompt_ids": [1], "max_new_tokens": 2.0}, [], "max_new_tokens must be an integer >= 0, got 2.0"),
    ({"prompt_ids": [1], "temperature": -1}, [], "temperature must be a finite number >= 0, got -1"),
    ({"prompt_ids": [1], "temperature": True}, [], "temperature must be a finite number >= 0, got True"),
    ('{"prompt_ids": [1], "temperature": NaN}', [], "temperature must be a finite number >= 0, got nan"),
    ({"prompt_ids": [1], "top_k": 0}, [], "top_k must be an integer >= 1, got 0"),
    ({"prompt_ids": [1], "top_p": 1.5}, [], "top_p must be a number in (0, 1], got 1.5"),
    ({"prompt_ids": [1], "seed": -1}, [], "seed must be an integer >= 0, got -1"),
    ({"prompt_ids": [1], "top_logprobs": -1}, [], "top_logprobs must be an integer in 0..20, got -1"),
    ({"prompt_ids": [1], "top_logprobs": "1"}, [], "top_logprobs must be an integer in 0..20, got '1'"),
    ({"prompt_ids": [1], "top_logprobs": 21}, [], "top_logprobs must be an integer in 0..20, got 21"),
    ({"prompt_ids": [1], "top_logprobs": 10 ** 20}, [], "top_logprobs must be an integer in 0..20, got 1000"),
    ({"prompt_ids": [1], "stop": "x"}, [], "stop must be a list of strings, got 'x'"),
    ({"prompt_ids": [1], "stop": 5}, [], "stop must be a list of strings, got 5"),
    ({"prompt_ids": [1], "stop": [5]}, [], "stop must be a list of strings, got [5]"),
    ({"prompt_ids": [1], "stop": {"a": 1}}, [], "stop must be a list of strings, got {'a': 1}"),
    ('{"prompt_ids": [1], "id": "\\ud800"}', [], "id must be valid Unicode text, got '\\ud800', a lone surrogate"),
    ('{"prompt_ids": [1], "id": "a\\udc00"}', [], "id must be valid Unicode text, got 'a\\udc00'"),
    ({"prompt_ids": [1], "stop": ["x"]}, [], "stop strings need the model's tokenizer"),
    ({"prompt_ids": list(range(61)), "max_new_tokens": 5}, [],
     "prompt of 61 tokens + 5 new tokens need 65 positions (the last new token is never fed), beyond the context "
     "of 64 (n_positions)"),
    ({"prompt_ids": list(range(30)), "max_new_tokens": 5}, ["--kv-cache-tokens", "32", "--max-new-tokens", "5"],
     "30 prompt tokens + 5 new tokens need 48 cache positions (whole pages of 16); the pool holds 32 "
     "(--kv-cache-tokens)"),  # the option as the user gave it
]


@pytest.mark.parametrize("bad, argv, message", BAD_LINES)
def test_a_bad_line_fails_the_run_before_any_work_naming_the_line(capsys, tmp_path, small, monkeypatch, bad,
                                                                  argv, message):
    def no_work(*args, **kwargs):
        raise AssertionError("the scheduler ran")

    monkeypatch.setattr(minigpt.engine.scheduler.Scheduler, "schedule", no_work)
    lines = [{"prompt_ids": [1]}, "", bad, {"prompt_ids": [2]}]
    code, outputs, err = batch(capsys, tmp_path, lines, small, *argv)
    assert (code, outputs) == (2, None)  # OUTPUT not even created
    assert err.startswith(f"error: {tmp_path / 'in.jsonl'} line 3: ") and message in err, err
    assert err.count("\n") == 1 and err.endswith("\n") and "Traceback" not in err


def test_the_first_bad_line_is_the_one_named(capsys, tmp_path, small):
    code, outputs, err = batch(capsys, tmp_path, [{"prompt_ids": [1]}, {"prompt_ids": [1], "top_k": 0}, "{"], small)
    assert (code, outputs) == (2, None)
    assert err == f"error: {tmp_path / 'in.jsonl'} line 2: top_k must be an integer >= 1, got 0\n"


def test_the_first_bad_line_in_order_is_named_whatever_its_fault(capsys, tmp_path, small):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"prompt_ids": [1]}\n{"prompt_ids": [1], "top_k": 0}\n{"prompt": "caf\xe9"}\n')
    assert main(["batch", str(source), "--model", small]) == 2
    assert capsys.readouterr().err == f"error: {source} line 2: top_k must be an integer >= 1, got 0\n"


def test_bytes_that_are_not_utf8_name_their_line(capsys, tmp_path, small):
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(b'{"prompt_ids": [1]}\n{"prompt": "caf\xe9"}\n')
    assert main(["batch", str(source), "-o", str(target), "--model", small]) == 2
    assert capsys.readouterr().err == f"error: {source} line 2 is not UTF-8 text: byte 16 is 0xe9\n"  # from 1
    assert not target.exists()


def test_a_missing_input_or_unwritable_output_is_a_usage_error(capsys, tmp_path, small):
    missing = tmp_path / "missing.jsonl"
    assert main(["batch", str(missing), "--model", small]) == 2
    assert capsys.readouterr().err == f"error: cannot read INPUT '{missing}': No such file or directory\n"
    source = write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [1]}])
    unwritable = tmp_path / "no" / "out.jsonl"
    assert main(["batch", str(source), "-o", str(unwritable), "--model", small]) == 2
    assert capsys.readouterr().err == f"error: cannot write OUTPUT {unwritable}: No such file or directory\n"


# Bounded reads, BOMs, and what a path can be

def run_batch(capsys, *argv: str) -> tuple[int, str]:
    code = main(["batch", *argv])
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    return code, err


def test_an_input_that_never_ends_is_refused_after_a_bounded_read(capsys, small):
    code, err = run_batch(capsys, "/dev/zero", "--model", small)  # no newline, ever
    assert (code, err) == (2, "error: /dev/zero line 1 is longer than 1,048,576 bytes (1 MiB): no prompt that "
                              "fits in a context needs as many\n")


def test_a_line_too_long_is_named_even_when_the_lines_before_it_are_fine(capsys, tmp_path, small):
    source = tmp_path / "in.jsonl"
    source.write_bytes(b'{"prompt_ids": [1]}\n\n' + b" " * (minigpt.cli.batch.MAX_LINE_BYTES + 1) + b"\n")
    assert run_batch(capsys, str(source), "--model", small) == (
        2, f"error: {source} line 3 is longer than 1,048,576 bytes (1 MiB): no prompt that fits in a context "
           "needs as many\n")


def test_the_line_bound_is_exact_and_holds_for_a_last_line_without_a_newline(capsys, tmp_path, small, monkeypatch):
    line = b'{"prompt_ids": [1], "max_new_tokens": 1}'
    monkeypatch.setattr(minigpt.cli.batch, "MAX_LINE_BYTES", len(line))
    source, target = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_bytes(line + b"\n" + line)
    assert main(["batch", str(source), "-o", str(target), "--model", small]) == 0
    assert len(target.read_text().splitlines()) == 2
    source.write_bytes(line + b"\n" + line + b" ")
    capsys.readouterr()
    assert run_batch(capsys, str(source), "--model", small)[1].startswith(f"error: {source} line 2 is longer than")


def test_more_lines_than_a_run_takes_are_refused_before_any_work(capsys, tmp_path, small, monkeypatch):
    monkeypatch.setattr(minigpt.cli.batch, "MAX_LINES", 5)  # as 100,000: `yes ''` never ends
    source = write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [1]}] * 3 + [""] * 3)
    assert run_batch(capsys, str(source), "--model", small) == (
        2, f"error: {source} has more than 5 lines, more than one run takes; split it\n")
    write_lines(source, [{"prompt_ids": [1], "max_new_tokens": 1}] * 5)  # at the limit
    assert main(["batch", str(source), "-o", str(tmp_path / "out.jsonl"), "--model", small]) == 0


def test_an_empty_path_is_named_not_read_as_the_current_directory(capsys, tmp_path, small):
    assert run_batch(capsys, "", "--model", small) == (2, "error: INPUT is an empty path: name a file, or - for "
                                                          "stdin\n")
    source = write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [1]}])
    assert run_batch(capsys, str(source), "-o", "", "--model", small) == (
        2, "error: OUTPUT is an empty path: name a file, or - for stdout\n")


def test_a_leading_bom_is_skipped_in_a_file_and_on_stdin(capsys, tmp_path, small, monkeypatch):
    lines = [{"id": "a", "prompt_ids": [1, 2]}, {"prompt_ids": [3], "max_new_tokens": 2}]
    _, expected, _ = batch(capsys, tmp_path, lines, small)
    source, target = tmp_path / "bom.jsonl", tmp_path / "bom-out.jsonl"
    source.write_bytes(codecs.BOM_UTF8 + (tmp_path / "in.jsonl").read_bytes())
    assert main(["batch", str(source), "-o", str(target), "--model", small]) == 0
    assert [json.loads(line) for line in target.read_text().splitlines()] == expected
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(source.read_bytes())))
    assert main(["batch", "-", "-o", str(target), "--model", small]) == 0
    assert [json.loads(line) for line in target.read_text().splitlines()] == expected
    source.write_bytes(codecs.BOM_UTF8 * 2 + b'{"prompt_ids": [1]}\n')  # only one is skipped: the second is text
    capsys.readouterr()
    assert run_batch(capsys, str(source), "--model", small)[1].startswith(f"error: {source} line 1: invalid JSON")


def test_a_pipe_such_as_a_process_substitution_is_read(capsys, tmp_path, small):
    """`batch <(...)` names /dev/fd/N, a pipe: read as it comes, as a file is."""
    read, write = os.pipe()
    os.write(write, b'{"prompt_ids": [1, 2], "max_new_tokens": 3}\n')
    os.close(write)
    target = tmp_path / "out.jsonl"
    try:
        assert main(["batch", f"/dev/fd/{read}", "-o", str(target), "--model", small]) == 0, capsys.readouterr()
    finally:
        os.close(read)
    assert [len(json.loads(line)["tokens"]) for line in target.read_text().splitlines()] == [3]


@pytest.mark.skipif(sys.platform == "win32", reason="a non-blocking pipe is a POSIX descriptor flag")
def test_a_non_blocking_stdout_with_a_slow_reader_still_gets_every_line_whole(tmp_path, tokenizer):
    """Whoever makes the pipe may set O_NONBLOCK on it: a full pipe then refuses a write (EAGAIN),
    which the command waits out, never ending with part of a line and "Resource temporarily unavailable"."""
    source = write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [i + 1] * 5, "top_logprobs": 20} for i in range(2)])
    read, write = os.pipe()
    os.set_blocking(write, False)
    with open(read, "rb") as reader:
        process = subprocess.Popen(command(str(source), "--model", "random-tiny", "--max-new-tokens", "100",
                                           "--no-stop"), stdout=write, stderr=subprocess.PIPE,
                                   env=environment(tmp_path / "hf"))
        os.close(write)
        try:
            out = b""
            while chunk := reader.read1(4096):  # slowly: a page at a time, so the pipe is often full
                out += chunk
                time.sleep(0.002)
            _, err = process.communicate(timeout=60)
        finally:
            process.kill()
    assert process.returncode == 0, err
    assert [len(json.loads(line)["tokens"]) for line in out.decode().splitlines()] == [100, 100]


def test_batch_runs_in_a_thread_too_where_signals_cannot_be_held(capsys, tmp_path, small):
    """Only the main thread may set signal handlers: elsewhere a line is written without them."""
    source, target, codes = write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [1, 2]}] * 2), tmp_path / "o", []
    thread = threading.Thread(target=lambda: codes.append(main(["batch", str(source), "-o", str(target),
                                                                "--model", small, "--max-new-tokens", "2"])))
    thread.start()
    thread.join(timeout=60)
    assert codes == [0] and len(target.read_text().splitlines()) == 2


@pytest.mark.parametrize("lines, argv, message", [
    ([{"prompt_ids": [1]}, {"prompt_ids": [2], "temperature": 0.5, "seed": 3}], ["--seed", "1"],
     "argument --seed: has no effect: every line is greedy (temperature 0) or has a seed of its own"),
    ([{"prompt_ids": [1], "temperature": 0.0}], ["--top-k", "5"],
     "argument --top-k: has no effect: every line is greedy (temperature 0) or has a top_k of its own"),
    ([{"prompt_ids": [1], "temperature": 1.0, "top_p": None}], ["--top-p", "0.5"],
     "argument --top-p: has no effect: every line is greedy (temperature 0) or has a top_p of its own"),
])
def test_an_option_no_line_takes_and_is_changed_by_is_a_usage_error(capsys, tmp_path, small, lines, argv,
                                                                     message):
    code, outputs, err = batch(capsys, tmp_path, lines, small, *argv)
    assert (code, outputs, err) == (2, None, f"error: {message}\n")
    lines.append({"prompt_ids": [3], "temperature": 0.7})  # a line that samples with the option: it counts
    assert batch(capsys, tmp_path, lines, small, *argv, "--max-new-tokens", "2")[0] == 0


def test_a_stop_option_every_line_overrides_is_a_usage_error(capsys, tmp_path, tokenizer):
    lines = [{"prompt": "a", "stop": ["b"]}, {"prompt": "c", "stop": None}]
    code, outputs, err = batch(capsys, tmp_path, lines, "random-tiny", "--stop", "x")
    assert (code, outputs, err) == (2, None, "error: argument --stop: has no effect: every line has a stop of its "
                                             "own\n")


def test_stop_strings_without_a_tokenizer_are_refused_as_the_option_not_a_line(capsys, tmp_path, small):
    code, outputs, err = batch(capsys, tmp_path, [{"prompt_ids": [1]}], small, "--stop", "x")
    assert (code, outputs) == (2, None)  # a usage error, naming the option
    assert err.startswith("error: argument --stop: stop strings need the model's tokenizer") and err.count("\n") == 1


# Text (random-tiny: GPT-2's vocabulary and tokenizer)

def test_text_prompts_stop_strings_and_the_text_field(capsys, tmp_path, tiny_model, tokenizer):
    pieces = [tokenizer.decode([t]) for t in minigpt.generate(tiny_model, minigpt.encode(tokenizer, "The dog"), 12,
                                                               temperature=1.0, seed=0).tokens]
    cut = next(i for i in range(2, 12) if pieces[i] not in "".join(pieces[:i]))  # a token whose text is new there
    lines = [{"prompt": "The dog", "stop": [pieces[cut], "never"]}, {"prompt": "The dog", "stop": None},
             {"prompt": ""}, {"prompt": "naïve café <|endoftext|>", "top_logprobs": 2}]
    code, outputs, err = batch(capsys, tmp_path, lines, "random-tiny", "--max-new-tokens", "12",
                               "--temperature", "1", "--seed", "0", "--stop", "x")
    assert code == 0, err
    for line, output in zip(lines, outputs):
        result = minigpt.generate(tiny_model, minigpt.encode(tokenizer, line["prompt"]), 12, temperature=1.0, seed=0,
                                  stop=line.get("stop", ["x"]), top_logprobs=line.get("top_logprobs", 0))
        assert_same(output, result)
        assert output["text"] == result.text
        for step in output.get("top_logprobs", []):
            assert [entry["token"] for entry in step] == [tokenizer.decode([entry["id"]]) for entry in step]
    assert outputs[0]["finish_reason"] == "stop" and outputs[0]["text"] == "".join(pieces[:cut])
    assert outputs[1]["text"] == "".join(pieces)  # null: no stop strings, not even --stop's
    assert outputs[2]["prompt_ids"] == [tiny_model.config.eos_token_id]
    assert tokenizer.decode(outputs[3]["prompt_ids"]) == "naïve café <|endoftext|>"
    assert outputs[3]["prompt_ids"][-1] == tiny_model.config.eos_token_id  # the literal is the special token


# The real command: stdin, stdout, Ctrl-C

def command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "minigpt", "batch", *argv]


def test_stdin_to_stdout_with_dashes(tmp_path, tokenizer):
    lines = "".join(json.dumps({"id": f"p{i}", "prompt_ids": [i + 1]}) + "\n" for i in range(3))
    for argv in (["-"], ["-", "-o", "-"]):
        done = subprocess.run(command(*argv, "--model", "random-tiny", "--max-new-tokens", "4"),
                              input=lines, capture_output=True, text=True, env=environment(tmp_path / "hf"),
                              timeout=120)
        assert done.returncode == 0, done.stderr
        outputs = [json.loads(line) for line in done.stdout.splitlines()]
        assert [(o["id"], len(o["tokens"])) for o in outputs] == [("p0", 4), ("p1", 4), ("p2", 4)]
        assert SUMMARY.search(done.stderr)[1] == "3"


def test_a_bad_line_on_stdin_is_named_as_stdin(tmp_path, tokenizer):
    done = subprocess.run(command("-", "--model", "random-tiny"), input='{"prompt_ids": [1]}\n{}\n',
                          capture_output=True, text=True, env=environment(tmp_path / "hf"), timeout=120)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == 'error: stdin line 2: a line needs exactly one of "prompt" (text) and "prompt_ids" ' \
                          "(token ids)\n"


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT cannot be sent to one process on Windows")
def test_ctrl_c_exits_130_and_every_line_written_is_whole_json(tmp_path, tokenizer):
    source = write_lines(tmp_path / "in.jsonl", [{"prompt_ids": [i + 1] * 5} for i in range(64)])
    stdout = tmp_path / "stdout"
    with open(stdout, "wb") as out:
        process = subprocess.Popen(
            command(str(source), "--model", "random-tiny", "--max-new-tokens", "250", "--no-stop",
                    "--max-batch-size", "2"),
            stdout=out, stderr=subprocess.PIPE, env=environment(tmp_path / "hf"),
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # even if our SIGINT is ignored
        )
        deadline = time.monotonic() + 60
        while stdout.read_bytes().count(b"\n") < 2:  # some lines written, many to come
            assert process.poll() is None, f"ended before the signal: {process.stderr.read()!r}"
            assert time.monotonic() < deadline, "no two lines within 60 s"
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=60)
    assert process.returncode == 130
    assert b"Traceback" not in err and b"error" not in err
    written = stdout.read_text()
    assert written.endswith("\n")
    outputs = [json.loads(line) for line in written.splitlines()]
    assert 2 <= len(outputs) < 64
    assert [o["id"] for o in outputs] == list(range(1, len(outputs) + 1))
    assert all(len(o["tokens"]) == 250 for o in outputs)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs Linux's F_GETPIPE_SZ to see a pipe is full")
@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("unbuffered", ["", "1"])
def test_a_signal_while_a_slow_pipe_takes_a_long_line_leaves_only_whole_lines(tmp_path, tokenizer, signum,
                                                                              unbuffered):
    """Lines of ~300 kB into a pipe of 64 KiB that nobody reads: the command is blocked inside line
    1 when the signal comes. It finishes the line as the pipe is drained, then stops as the signal
    says. Unbuffered (python -u), a short write is followed by the rest of the line, never dropped."""
    import fcntl
    import termios

    signum = getattr(signal, signum)
    lines = [{"prompt_ids": [i + 1] * 5, "top_logprobs": 20} for i in range(8)]
    source = write_lines(tmp_path / "in.jsonl", lines)
    process = subprocess.Popen(
        command(str(source), "--model", "random-tiny", "--max-new-tokens", "250", "--no-stop", "--max-batch-size", "1"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**environment(tmp_path / "hf"),
                                                             "PYTHONUNBUFFERED": unbuffered},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # even if our SIGINT is ignored
    )
    try:
        pipe = process.stdout.fileno()
        capacity = fcntl.fcntl(pipe, fcntl.F_GETPIPE_SZ)
        deadline = time.monotonic() + 60
        while struct.unpack("i", fcntl.ioctl(pipe, termios.FIONREAD, b"\0" * 4))[0] < capacity:  # full: blocked
            assert process.poll() is None, f"ended before the signal: {process.stderr.read()!r}"
            assert time.monotonic() < deadline, "the pipe was not full within 60 s"
            time.sleep(0.02)
        process.send_signal(signum)
        out, err = process.communicate(timeout=60)  # the slow reader now drains the pipe
    finally:
        process.kill()
    assert process.returncode == (130 if signum == signal.SIGINT else -signum), err
    assert b"Traceback" not in err
    assert out.endswith(b"\n") and len(out) > capacity
    outputs = [json.loads(line) for line in out.decode().splitlines()]
    assert 1 <= len(outputs) < len(lines)
    assert all(len(o["top_logprobs"]) == 250 for o in outputs)
