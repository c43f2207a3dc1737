"""Every file a command reads is read with a bound (minigpt.cli.flags.read_text, batch's lines): a
device that never ends or a huge file is one `error: ...` line and exit 2 after a bounded read,
never a MemoryError or a traceback."""

from __future__ import annotations

import pytest

from commands import run

from minigpt.cli.flags import MAX_CONSTRAINT_FILE_BYTES
from minigpt.requests.structured import MAX_CONSTRAINT_CHARS


@pytest.fixture(scope="module")
def huge(tmp_path_factory):
    """A sparse file of 8 GiB of zero bytes: reading it whole would end in a MemoryError."""
    path = tmp_path_factory.mktemp("huge") / "huge.json"
    with open(path, "wb") as f:
        f.truncate(8 << 30)
    return str(path)


@pytest.mark.parametrize("flag", ["--grammar", "--json-schema"])
@pytest.mark.parametrize("command", ["generate", "batch"])
def test_a_constraint_file_that_never_ends_is_one_error_line(capsys, tmp_path, huge, flag, command):
    source = tmp_path / "in.jsonl"
    source.write_text('{"prompt": "a"}\n')
    before = ["hi"] if command == "generate" else [str(source), "-o", str(tmp_path / "out.jsonl")]
    for path in ("/dev/zero", huge):
        code, out, err = run(capsys, command, *before, "--model", "random-tiny", flag, path)
        assert (code, out) == (2, "") and err.count("\n") == 1, err
        assert err == (f"error: {flag} {path!r} holds more than {MAX_CONSTRAINT_FILE_BYTES >> 10} KiB, more than a "
                       f"constraint's {MAX_CONSTRAINT_CHARS:,} characters take\n")


def test_a_constraint_file_at_the_bound_is_read_whole(capsys, tmp_path):
    """The bound is on bytes read: a grammar file of exactly MAX_CONSTRAINT_FILE_BYTES passes the read
    (and its text is then refused as too long by the constraint's own limit, naming the flag)."""
    path = tmp_path / "g.lark"
    path.write_text('start: "' + "a" * (MAX_CONSTRAINT_FILE_BYTES - 10) + '"\n')
    assert path.stat().st_size == MAX_CONSTRAINT_FILE_BYTES
    code, out, err = run(capsys, "generate", "hi", "--model", "random-tiny", "--grammar", str(path))
    assert (code, out) == (2, "") and err.startswith("error: argument --grammar: is too long: "), err


def test_batch_input_that_never_ends_is_one_error_line(capsys, tmp_path, huge):
    for path in ("/dev/zero", huge):
        code, out, err = run(capsys, "batch", path, "-o", str(tmp_path / "out.jsonl"), "--model", "random-tiny")
        assert (code, out) == (2, "") and err.count("\n") == 1 and "is longer than 1,048,576 bytes" in err, err


def test_score_file_that_never_ends_is_one_error_line(capsys, huge):
    code, out, err = run(capsys, "score", "--file", huge, "--model", "random-tiny")
    assert (code, out) == (2, "") and err.startswith(f"error: --file {huge!r} holds more than 4 MiB"), err
