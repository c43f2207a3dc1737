"""A picture is written whole or not at all: into a hidden file beside its path, renamed into place,
so a failure midway (Ctrl-C, a file-size limit) leaves no partial file and an earlier picture stays;
every command that draws checks its preconditions (matplotlib, the folder) before the model is
loaded; and `batch --plot` with nothing to draw says so and exits non-zero, writing no picture."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys

import pytest

from commands import run

from minigpt.cli import pictures

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
from matplotlib.figure import Figure  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def interrupted_savefig(self, file, **kwargs):
    """Figure.savefig that writes the start of a PNG, then is interrupted (Ctrl-C)."""
    file.write(PNG + b"partial")
    raise KeyboardInterrupt


@pytest.mark.parametrize("command", [
    ["prove", "--model", "random-tiny", "--steps", "2", "--plot", "{dir}/p.png"],
    ["inspect", "The dog", "--model", "random-tiny", "--plot", "{dir}"],
    ["staircase", "--model", "random-tiny", "--prompt-tokens", "4", "--new-tokens", "3", "--plot", "{dir}/s.png"],
])
def test_a_picture_interrupted_while_written_leaves_no_file_and_the_earlier_one_as_it_was(
        capsys, tmp_path, monkeypatch, command):
    earlier = PNG + b"the earlier picture"
    for name in ("p.png", "attention.png", "logit-lens.png", "s.png"):
        (tmp_path / name).write_bytes(earlier)
    monkeypatch.setattr(Figure, "savefig", interrupted_savefig)
    assert run(capsys, *[arg.format(dir=tmp_path) for arg in command])[0] == 130  # as after Ctrl-C
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attention.png", "logit-lens.png", "p.png", "s.png"]
    assert all(p.read_bytes() == earlier for p in tmp_path.iterdir())


def test_a_file_size_limit_leaves_no_partial_picture_and_one_error_line(tmp_path):
    """A process limited to 4 KiB per file (RLIMIT_FSIZE: Python ignores SIGXFSZ, so the write fails
    with EFBIG): prove draws its picture, which cannot be written whole."""
    limit = 4096
    result = subprocess.run(
        [sys.executable, "-m", "minigpt", "prove", "--model", "random-tiny", "--steps", "2", "--plot",
         str(tmp_path / "p.png")], capture_output=True, text=True, timeout=300,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)))
    assert result.returncode == 1 and result.stderr.startswith("error: cannot write the picture to ")
    assert "Traceback" not in result.stderr and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [
    ["inspect", "The dog", "--model", "random-tiny", "--plot", "{dir}"],
    ["prove", "--model", "random-tiny", "--plot", "{dir}/p.png"],
    ["staircase", "--model", "random-tiny", "--plot", "{dir}/s.png"],
])
def test_without_matplotlib_a_picture_command_fails_before_loading_the_model(capsys, tmp_path, monkeypatch, command):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    monkeypatch.setattr("minigpt.cli.flags.load", lambda *a, **k: pytest.fail("the model was loaded"))
    code, _, err = run(capsys, *[arg.format(dir=tmp_path) for arg in command])
    assert code == 1 and "--plot needs matplotlib" in err and err.count("\n") == 1


@pytest.mark.parametrize("where, words", [("missing", "is not a directory"), ("file", "is not a directory")])
def test_inspect_plot_into_no_folder_fails_before_loading_the_model(capsys, tmp_path, monkeypatch, where, words):
    target = tmp_path / where
    if where == "file":
        target.write_text("x")
    monkeypatch.setattr("minigpt.cli.flags.load", lambda *a, **k: pytest.fail("the model was loaded"))
    code, _, err = run(capsys, "inspect", "The dog", "--model", "random-tiny", "--plot", str(target))
    assert code == 2 and words in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder: nothing to refuse")
def test_inspect_plot_into_a_read_only_folder_fails_before_loading_the_model(capsys, tmp_path, monkeypatch):
    tmp_path.chmod(0o500)
    monkeypatch.setattr("minigpt.cli.flags.load", lambda *a, **k: pytest.fail("the model was loaded"))
    try:
        code, _, err = run(capsys, "inspect", "The dog", "--model", "random-tiny", "--plot", str(tmp_path))
    finally:
        tmp_path.chmod(0o700)
    assert code == 2 and "permission denied" in err


def test_batch_plot_with_nothing_to_draw_says_so_and_exits_1(capsys, tmp_path):
    source, target, plot = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "pool.png"
    source.write_text(json.dumps({"prompt": "The dog", "max_new_tokens": 0}) + "\n")
    code, out, err = run(capsys, "batch", str(source), "-o", str(target), "--model", "random-tiny",
                         "--plot", str(plot))
    assert code == 1 and "error: --plot: nothing to draw, no engine step ran" in err
    assert len(target.read_text().splitlines()) == 1 and not plot.exists()


def test_a_written_picture_is_readable_by_others_as_any_new_file_is(tmp_path):
    fig = pictures.figure(2, 2)
    fig.add_subplot().plot([0, 1], [0, 1])
    old = os.umask(0o022)
    try:
        pictures.save(fig, tmp_path / "x.png")
    finally:
        os.umask(old)
    assert (tmp_path / "x.png").read_bytes()[:8] == PNG and (tmp_path / "x.png").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["x.png"]
