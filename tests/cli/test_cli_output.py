"""The command line's output side, hostile: stdout encodings, closed or full streams, --plot
targets, huge sizes, --version, unrecognized arguments, make_checkpoint.py, the empty prompt.

Each class is run through `minigpt.cli.main` in-process for every command (fast: the streams are
swapped for closed, full or ASCII ones), and once through the real `python -m minigpt` in a
subprocess, whose exit status and descriptors are what a shell sees. The rows are in
docs/loading.md ("Output streams and encodings", "The command line's own cases").
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from checkpoints import make_checkpoint
from commands import REPO, assert_error, cli, environment

from minigpt.cli import main

EOT = 50256
BIG = str(10 ** 30)
PROMPT = "café 😀"  # é is in latin-1, 😀 in neither latin-1 nor ascii
requires_dev_full = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full on this system")


@pytest.fixture(autouse=True)
def bpe_tables(tokenizer):
    """Every command here tokenizes: the packaged tables, checked once for the module."""


@pytest.fixture(scope="module")
def prompts(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("batch") / "prompts.jsonl"
    path.write_text(json.dumps({"prompt": PROMPT, "max_new_tokens": 2}) + "\n")
    return str(path)


def commands(prompts: str) -> dict[str, list[str]]:
    """Every command, at its smallest, with non-ASCII text wherever it takes text."""
    tiny = ["--model", "random-tiny"]
    return {"generate": ["generate", PROMPT, *tiny, "--max-new-tokens", "2"],
            "batch": ["batch", prompts, *tiny],
            "score": ["score", PROMPT, *tiny],
            "prove": ["prove", "--prompt", PROMPT, "--steps", "2", *tiny],
            "staircase": ["staircase", *tiny, "--new-tokens", "2"],
            "cost": ["cost", "--prompt", "1", "--reply", "1"]}


COMMANDS = ("generate", "batch", "score", "prove", "staircase", "cost")


def run_main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # argparse's usage errors
        return e.code


def subprocess_run(tmp_path: Path, argv: list[str], env: dict | None = None, **streams) -> subprocess.CompletedProcess:
    """The real `python -m minigpt ARGV`; streams as subprocess.run takes them (default: captured)."""
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **streams}
    return subprocess.run([sys.executable, "-m", "minigpt", *argv], env={**environment(tmp_path / "hf"), **(env or {})},
                          timeout=120, **streams)


def close(fd: int):
    return lambda: os.close(fd)  # a preexec_fn: the command starts with descriptor fd closed (`>&-`, `2>&-`)


# Encodings

ENCODINGS = {"ascii": {"PYTHONIOENCODING": "ascii"}, "latin-1": {"PYTHONIOENCODING": "latin-1"},
             "C locale": {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": ""}}


@pytest.mark.parametrize("name", ENCODINGS)
def test_generate_text_survives_any_stdout_encoding_and_json_stays_valid(tmp_path, name):
    """The streamed text is the JSON's prompt + text in the stdout's encoding, with `?` for what it
    lacks; --json is ASCII and parses back to the very text."""
    env = ENCODINGS[name]
    argv = ["generate", PROMPT, "--model", "random-tiny", "--max-new-tokens", "6", "--temperature", "1",
            "--seed", "3"]
    as_json = subprocess_run(tmp_path, [*argv, "--json"], env)
    assert as_json.returncode == 0 and b"Traceback" not in as_json.stderr, as_json.stderr
    document = json.loads(as_json.stdout.decode("ascii"))
    assert document["prompt"] == PROMPT
    text = subprocess_run(tmp_path, argv, env)
    assert text.returncode == 0 and text.stderr == b"", text.stderr
    encoding = "ascii" if name == "C locale" else name
    assert text.stdout == (PROMPT + document["text"] + "\n").encode(encoding, "replace")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_prints_under_an_ascii_stdout(capsys, monkeypatch, prompts, command):
    buffer = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(buffer, encoding="ascii", errors="strict"))
    assert run_main(commands(prompts)[command]) == 0, capsys.readouterr().err
    sys.stdout.flush()
    out = buffer.getvalue().decode("ascii")
    shown = {"generate": PROMPT.encode("ascii", "replace").decode(), "score": "'?'"}  # é (and 😀) as ?
    assert out and shown.get(command, "") in out


@pytest.mark.parametrize("command", ["generate", "score", "prove"])
def test_json_is_ascii_and_valid_unicode_even_for_undecodable_argument_bytes(capsys, monkeypatch, prompts, command):
    """A command line's byte 0xff reaches Python as the surrogate escape \\udcff; JSON shows U+FFFD,
    never a lone surrogate (which strict parsers refuse)."""
    argv = [a.replace(PROMPT, "caf\udcff") for a in commands(prompts)[command]]
    code, out, err = cli(capsys, *argv[1:], "--json", command=command)
    assert code == 0, err
    assert out.isascii() and "\\udcff" not in out
    document = json.loads(out)
    assert "\ufffd" in (document["token_texts"][-1] if command == "score" else document["prompt"])


# Closed, full or read-only stdout; closed or full stderr

@pytest.mark.parametrize("command", COMMANDS)
def test_a_closed_stdout_is_one_error_line_before_any_work(capsys, monkeypatch, prompts, command):
    monkeypatch.setattr(sys, "stdout", None)  # what Python makes of `>&-`
    code = run_main(commands(prompts)[command])
    assert_error((code, "", capsys.readouterr().err), ["stdout is closed"])


def test_batch_with_an_output_file_does_without_stdout(capsys, monkeypatch, prompts, tmp_path):
    monkeypatch.setattr(sys, "stdout", None)
    output = tmp_path / "out.jsonl"
    assert run_main([*commands(prompts)["batch"], "-o", str(output)]) == 0
    assert json.loads(output.read_text())["id"] == 1


def test_version_with_a_closed_stdout_is_an_error_not_a_silent_success(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdout", None)
    assert_error((run_main(["--version"]), "", capsys.readouterr().err), ["stdout is closed"])


@requires_dev_full
def test_a_batch_output_file_that_cannot_be_written_is_one_error_line(capsys, prompts):
    """`-o /dev/full` (or a disk that fills): the write fails after the work, as stdout's would."""
    code = run_main([*commands(prompts)["batch"], "-o", "/dev/full"])
    out, err = capsys.readouterr()  # after the progress bar
    assert (code, out) == (1, "") and err.endswith("\nerror: cannot write OUTPUT /dev/full: No space left on device\n")
    assert "Traceback" not in err


def test_a_closed_stdin_is_a_usage_error_for_batch(capsys, monkeypatch):
    monkeypatch.setattr(sys, "stdin", None)  # `<&-`
    code = run_main(["batch", "-", "--model", "random-tiny"])
    assert_error((code, "", capsys.readouterr().err), ["cannot read INPUT -: stdin is closed"], exit_code=2)


@requires_dev_full
@pytest.mark.parametrize("command", COMMANDS)
def test_a_full_stdout_is_one_error_line_and_exit_1(capsys, monkeypatch, prompts, command):
    """cost, prove and staircase check their last flush too: output lost is never an exit 0."""
    with open("/dev/full", "w") as full:
        monkeypatch.setattr(sys, "stdout", full)
        code = run_main(commands(prompts)[command])
    _, err = capsys.readouterr()
    assert code == 1 and err.endswith("error: cannot write to stdout: No space left on device\n"), err
    assert "Traceback" not in err


@requires_dev_full
@pytest.mark.parametrize("stderr", ["closed", "full"])
@pytest.mark.parametrize("command", ["batch", "staircase"])
def test_a_closed_or_full_stderr_does_not_fail_a_command(capsys, monkeypatch, prompts, command, stderr):
    """Their progress bars and summaries go to stderr; losing them is no failure."""
    with open("/dev/full", "w") as full:
        monkeypatch.setattr(sys, "stderr", None if stderr == "closed" else full)
        assert run_main(commands(prompts)[command]) == 0
    out = capsys.readouterr().out
    assert out.startswith('{"id": 1' if command == "batch" else "random-tiny")  # and print(file=None) went nowhere
    assert "requests," not in out


@requires_dev_full
def test_the_real_process_exits_1_on_a_closed_or_full_stdout_and_0_on_a_closed_stderr(tmp_path, prompts):
    """At the descriptors' level, as a shell sees it: no traceback, no exit status 120 from the
    interpreter's last flush."""
    closed = subprocess_run(tmp_path, commands(prompts)["generate"], preexec_fn=close(1))
    assert closed.returncode == 1
    assert closed.stderr == b"error: stdout is closed: there is nowhere to print the output\n"
    with open("/dev/full", "wb") as full:
        done = subprocess_run(tmp_path, commands(prompts)["cost"], stdout=full)
    assert done.returncode == 1 and done.stderr == b"error: cannot write to stdout: No space left on device\n"
    done = subprocess_run(tmp_path, commands(prompts)["staircase"], preexec_fn=close(2))
    assert done.returncode == 0 and b"naive / cached total time" in done.stdout
    with open("/dev/full", "wb") as full:
        done = subprocess_run(tmp_path, commands(prompts)["batch"], stderr=full)
    assert done.returncode == 0 and json.loads(done.stdout)["finish_reason"] == "length"


# --plot

@pytest.mark.parametrize("target, names", [
    ("x.foo", ["argument --plot", "x.foo", "matplotlib cannot write a .foo file", ".png", ".svg"]),
    ("", ["argument --plot", "is a directory", "staircase.png"]),  # tmp_path itself
    ("no/such/dir/x.png", ["argument --plot", "there is no directory", "no/such/dir"]),
])
def test_a_bad_plot_target_is_a_usage_error_before_the_model_is_loaded(capsys, tmp_path, target, names):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    path = str(tmp_path / target)
    assert_error(cli(capsys, "--model", "no-such-model", "--plot", path, command="staircase"), names, exit_code=2)


def test_an_empty_plot_path_is_a_usage_error_not_the_current_directory(capsys):
    assert_error(cli(capsys, "--model", "no-such-model", "--plot", "", command="staircase"),
                 ["argument --plot: is an empty path: name a file, such as staircase.png"], exit_code=2)


@pytest.mark.parametrize("make, what", [(os.mkfifo, "is a FIFO, not a file"),
                                        (lambda p: os.symlink(p.name, p), "is a symlink loop")], ids=["fifo", "loop"])
def test_a_plot_target_that_is_no_file_is_a_usage_error_before_the_model_is_loaded(capsys, tmp_path, make, what):
    """Not after the measurement, as matplotlib's "not seekable" or "too many levels of symbolic links"."""
    make(tmp_path / "plot.png")
    assert_error(cli(capsys, "--model", "no-such-model", "--plot", str(tmp_path / "plot.png"), command="staircase"),
                 ["argument --plot", what], exit_code=2)


@pytest.mark.parametrize("name", ["m$\\frac{$", "m\udcff"], ids=["dollars", "undecodable-byte"])
def test_a_model_path_in_the_plot_title_is_plain_text(capsys, tmp_path, name):
    """matplotlib would parse "$...$" as mathtext, and fail on a lone surrogate, after the measurement."""
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    directory = make_checkpoint(tmp_path / name)
    code, out, err = cli(capsys, "--model", str(directory), "--new-tokens", "2", "--plot", str(tmp_path / "p.svg"),
                         command="staircase")
    assert code == 0 and "Traceback" not in err, err
    assert (tmp_path / "p.svg").read_text().count("<svg") == 1


def test_a_read_only_plot_directory_is_a_usage_error(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # read-only even for root, who may write anywhere
    assert_error(cli(capsys, "--model", "no-such-model", "--plot", str(tmp_path / "x.png"), command="staircase"),
                 ["argument --plot", "cannot be written: permission denied"], exit_code=2)


def test_a_plot_name_without_an_extension_is_a_png_at_exactly_that_path(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    path = tmp_path / "latency"
    code, out, err = cli(capsys, "--model", "random-tiny", "--new-tokens", "2", "--plot", str(path), "--json",
                         command="staircase")
    assert code == 0, err
    assert json.loads(out)["plot"] == str(path) and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [p.name for p in tmp_path.iterdir()] == ["latency"]


# Sizes

@pytest.mark.parametrize("argv, names, exit_code", [  # 2: the error is about an option's value (a usage error)
    (["staircase", "--prompt-tokens", "100000000"], ["argument --prompt-tokens", "prompt of 100000000 tokens",
                                                     "256 (n_positions)"], 2),
    (["staircase", "--prompt-tokens", BIG], [f"prompt of {BIG} tokens", "256 (n_positions)"], 2),
    (["staircase", "--new-tokens", BIG], [f"{BIG} new tokens", "256 (n_positions)"], 2),
    (["generate", "hi", "--max-new-tokens", BIG], [f"{BIG} new tokens", "256 (n_positions)"], 1),
    (["prove", "--steps", BIG], [f"{BIG} new tokens", "256 (n_positions)"], 1),
])
def test_a_huge_size_fails_on_the_context_check_before_allocating(capsys, argv, names, exit_code):
    code, out, err = cli(capsys, *argv[1:], "--model", "random-tiny", command=argv[0])
    assert_error((code, out, err), names, exit_code)
    assert "truncate" not in err or argv[0] == "generate"  # each command suggests only its own options


@pytest.mark.parametrize("option", ["--max-batch-size", "--kv-cache-tokens"])
def test_batch_allocates_no_more_than_the_prompts_use_whatever_the_sizes(capsys, prompts, option):
    code, out, err = cli(capsys, prompts, "--model", "random-tiny", option, BIG, command="batch")
    assert code == 0, err
    assert "of 16 pages in use" in err  # one request: one context of 256 positions


def test_cost_refuses_counts_beyond_finite_arithmetic(capsys):
    assert_error(cli(capsys, "--prompt", str(10 ** 400), "--reply", "1", command="cost"),
                 ["argument --prompt", "must be in 1..10**15"], exit_code=2)


@pytest.mark.parametrize("command, suggests", [("generate", "(--truncate-prompt)"), ("batch", None), ("prove", None)])
def test_a_prompt_too_long_suggests_only_the_commands_own_options(capsys, tmp_path, command, suggests):
    long_prompt = "hi " * 250
    if command == "batch":
        path = tmp_path / "long.jsonl"
        path.write_text(json.dumps({"prompt": long_prompt}) + "\n")
        argv = [str(path)]
    else:
        argv = [long_prompt] if command == "generate" else ["--prompt", long_prompt]
    code, out, err = cli(capsys, *argv, "--model", "random-tiny", command=command)
    assert code in (1, 2) and "beyond the context of 256" in err and "truncate_prompt=True" not in err
    assert (suggests in err) if suggests else ("truncate" not in err)


# --version, unrecognized arguments

def test_version_is_the_package_metadata(tmp_path):
    done = subprocess_run(tmp_path, ["--version"])
    assert done.returncode == 0 and done.stderr == b""
    assert done.stdout.decode() == f"minigpt {importlib.metadata.version('minigpt')}\n"


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unrecognized_argument_points_to_the_commands_help(capsys, prompts, command):
    code = run_main([*commands(prompts)[command], "--foo"])
    assert_error((code, "", capsys.readouterr().err),
                 [f"error: unrecognized arguments: --foo (see python -m minigpt {command} --help)"], exit_code=2)


# Ctrl-C while the modules load

@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT cannot be sent to one process on Windows")
def test_ctrl_c_while_the_modules_load_exits_130_without_a_traceback(tmp_path):
    """-X importtime reports each module as it finishes: the signal is sent once numpy's core has
    loaded, halfway through `import minigpt`."""
    process = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "minigpt", "cost", "--prompt", "1",
                                "--reply", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=environment(tmp_path / "hf"),
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    for line in process.stderr:
        lines.append(line)
        if b"numpy._core._multiarray_umath" in line:
            process.send_signal(signal.SIGINT)
            break
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, b"".join(lines[-5:]) + err
    assert out == b"" and b"Traceback" not in err and b"KeyboardInterrupt" not in err


# The empty prompt

def test_an_empty_prompt_is_conditioned_on_endoftext_and_prints_only_the_new_text(capsys):
    """GPT-2's convention: generation starts from <|endoftext|> (prompt_ids [50256]), which is the
    model's context, not text the user typed: nothing of it is echoed."""
    argv = ["", "--model", "random-tiny", "--max-new-tokens", "5", "--temperature", "1", "--seed", "3"]
    code, out, err = cli(capsys, *argv, "--json")
    assert code == 0, err
    document = json.loads(out)
    assert document["prompt"] == "" and document["prompt_ids"] == [EOT] and EOT not in document["tokens"]
    code, out, err = cli(capsys, *argv)
    assert code == 0 and out == document["text"] + "\n" and "<|endoftext|>" not in out


# scripts/make_checkpoint.py

def make_checkpoint_main():
    spec = importlib.util.spec_from_file_location("make_checkpoint", REPO / "scripts" / "make_checkpoint.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


@pytest.mark.parametrize("argv, code, message", [
    (["--seed", "-1"], 2, "error: argument --seed: must be >= 0, got -1 (see make_checkpoint.py --help)"),
    (["--shards", "0"], 2, "error: argument --shards: must be >= 1, got 0 (see make_checkpoint.py --help)"),
    (["--shards", "99"], 2, "error: argument --shards: shards must be in 1..28 (one tensor at least each), got 99"),
    ([], 2, "error: OUT_DIR {file} exists and is not a directory (see make_checkpoint.py --help)"),
])
def test_make_checkpoint_errors_are_one_clear_line(capsys, tmp_path, argv, code, message):
    file = tmp_path / "file"
    file.write_text("")
    out_dir = str(file) if not argv else str(tmp_path / "out")
    with pytest.raises(SystemExit) as exit:
        make_checkpoint_main()([out_dir, *argv])
    err = capsys.readouterr().err
    assert exit.value.code == code and err.startswith(message.format(file=file)) and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_make_checkpoint_cannot_write_under_a_file(capsys, tmp_path):
    file = tmp_path / "file"
    file.write_text("")
    with pytest.raises(SystemExit) as exit:
        make_checkpoint_main()([str(file / "sub")])
    err = capsys.readouterr().err
    assert exit.value.code == 1 and err == f"error: cannot write {file / 'sub'}: Not a directory\n"


def test_make_checkpoint_names_a_bpe_table_that_is_not_a_file(capsys, tmp_path):
    (tmp_path / "bpe").mkdir()
    (tmp_path / "bpe" / "vocab.bpe").write_text("#version: 0.2\n")
    os.symlink("encoder.json", tmp_path / "bpe" / "encoder.json")
    with pytest.raises(SystemExit) as exit:
        make_checkpoint_main()([str(tmp_path / "out"), "--bpe-dir", str(tmp_path / "bpe")])
    err = capsys.readouterr().err
    assert exit.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"error: argument --bpe-dir: {tmp_path / 'bpe' / 'encoder.json'} is a symlink loop"), err
