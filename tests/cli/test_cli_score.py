"""`python -m minigpt score`: the table, the JSON, --file and --stride, with GPT-2's real tokenizer.
(Its error rows are in test_cli_errors.py.)"""

from __future__ import annotations

import codecs
import io
import json
import math
import os
import sys

import pytest
from commands import cli

import minigpt
import minigpt.cli.score

TEXT = "The dog said:\n\"naïve café\"\tok"


@pytest.fixture(autouse=True)
def bpe_tables(tokenizer):
    """Every command here tokenizes: skip (saying how to fix it) when GPT-2's BPE tables are missing."""


def score_json(capsys, *argv: str) -> dict:
    code, out, err = cli(capsys, *argv, "--model", "random-tiny", "--json", command="score")
    assert code == 0 and err == "", err
    return json.loads(out)


def test_json_gives_each_tokens_logprob_and_the_totals(capsys, tiny_model, tokenizer):
    document = score_json(capsys, TEXT)
    ids = minigpt.encode(tokenizer, TEXT)
    logprobs = minigpt.score(tiny_model, ids).tolist()
    assert set(document) == {"model", "kernels", "stride", "n_positions", "tokens", "token_texts", "logprobs",
                             "total_logprob", "mean_logprob", "perplexity"}
    assert (document["model"], document["kernels"], document["stride"]) == ("random-tiny", "exact", 128)
    assert document["tokens"] == ids and document["logprobs"] == logprobs
    assert "".join(document["token_texts"]) == TEXT  # every character here is whole in one token
    assert document["total_logprob"] == pytest.approx(sum(logprobs), rel=1e-12)
    assert document["mean_logprob"] == pytest.approx(sum(logprobs) / len(logprobs), rel=1e-12)
    assert document["perplexity"] == pytest.approx(math.exp(-document["mean_logprob"]), rel=1e-12)


def test_the_table_shows_every_token_escaped_and_the_totals(capsys, tiny_model, tokenizer):
    code, out, err = cli(capsys, TEXT, "--model", "random-tiny", command="score")
    assert code == 0 and err == ""
    ids = minigpt.encode(tokenizer, TEXT)
    logprobs = minigpt.score(tiny_model, ids)
    rows = [line.split() for line in out.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert [int(row[1]) for row in rows] == ids  # one line per token: no raw newline or tab breaks the table
    assert [row[-1] for row in rows] == ["-", *(f"{x:.4f}" for x in logprobs)]
    assert "'\\n'" in out and "'\\t'" in out  # shown escaped
    assert f"total log-probability {logprobs.sum():.4f} nats" in out
    assert f"perplexity            {math.exp(-logprobs.mean()):.4g}" in out


def test_a_file_scores_as_its_text(capsys, tmp_path):
    path = tmp_path / "text.txt"
    path.write_text(TEXT, encoding="utf-8")
    assert score_json(capsys, "--file", str(path)) == score_json(capsys, TEXT)


def test_a_text_longer_than_the_context_is_scored_with_the_stride(capsys, tiny_model, tmp_path, tokenizer):
    text = " ".join(f"word{i}" for i in range(150))  # ~300 tokens, random-tiny holds 256
    path = tmp_path / "long.txt"
    path.write_text(text, encoding="utf-8")
    ids = minigpt.encode(tokenizer, text)
    assert len(ids) > tiny_model.config.n_positions
    document = score_json(capsys, "--file", str(path), "--stride", "100")
    assert document["stride"] == 100 and document["logprobs"] == minigpt.score(tiny_model, ids, 100).tolist()


def test_a_leading_bom_is_skipped_as_utf_8_sig_skips_it(capsys, tmp_path):
    """A BOM is skipped, never scored as three U+FFFD tokens."""
    path = tmp_path / "bom.txt"
    path.write_bytes(codecs.BOM_UTF8 + TEXT.encode())
    assert score_json(capsys, "--file", str(path)) == score_json(capsys, TEXT)


def test_stdin_a_pipe_and_dev_stdin_are_read(capsys, tmp_path, monkeypatch):
    expected = score_json(capsys, TEXT)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(TEXT.encode())))
    assert score_json(capsys, "--file", "-") == expected
    read, write = os.pipe()  # what `--file <(...)` and `--file /dev/stdin` of a pipe name
    os.write(write, TEXT.encode())
    os.close(write)
    try:
        assert score_json(capsys, "--file", f"/dev/fd/{read}") == expected
    finally:
        os.close(read)


def test_a_file_that_never_ends_is_refused_after_a_bounded_read(capsys):
    code, out, err = cli(capsys, "--file", "/dev/zero", "--model", "random-tiny", command="score")
    assert (code, out) == (2, "")
    assert err == ("error: --file '/dev/zero' holds more than 4 MiB, more than one scoring run takes (about a "
                   "million tokens); score it in parts\n")


@pytest.mark.parametrize("argv, message", [
    (["--file", ""], "error: --file is an empty path: name a file, or - for stdin"),
    (["a b", "--stride", "0"], "error: argument --stride: must be >= 1, got 0"),
    (["a b", "--stride", "257"], "error: argument --stride: must be an integer in 1..256, got 257"),
])
def test_usage_errors_exit_2_naming_the_option(capsys, argv, message):
    code, out, err = cli(capsys, *argv, "--model", "random-tiny", command="score")
    assert (code, out) == (2, "") and err.startswith(message) and err.count("\n") == 1, err


def test_the_file_bound_is_exact(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(minigpt.cli.score, "MAX_FILE_BYTES", len(TEXT.encode()))
    path = tmp_path / "text.txt"
    path.write_bytes(codecs.BOM_UTF8 + TEXT.encode())  # the BOM does not count
    assert score_json(capsys, "--file", str(path)) == score_json(capsys, TEXT)
    path.write_bytes(TEXT.encode() + b" ")
    code, out, err = cli(capsys, "--file", str(path), "--model", "random-tiny", command="score")
    assert (code, out) == (2, "") and "holds more than" in err
