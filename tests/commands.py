"""The command line for the tests that run it: in-process (exit code, stdout and stderr), its
error line checked, and the environment of a subprocess that runs it."""

from __future__ import annotations

import json
import os
from pathlib import Path

from minigpt.cli import main

REPO = Path(__file__).resolve().parents[1]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """`python -m minigpt ARGV` in-process (argparse's usage errors too): exit code, stdout, stderr."""
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def cli(capsys, *argv: str, command: str = "generate") -> tuple[int, str, str]:
    """`python -m minigpt COMMAND ARGV` in-process: exit code, stdout, stderr."""
    return run(capsys, command, *argv)


def write_lines(path: Path, lines) -> Path:
    """A JSON Lines file: dicts are dumped, strings written as they are."""
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def batch(capsys, tmp_path: Path, lines, model: str, *argv: str) -> tuple[int, list[dict] | None, str]:
    """`python -m minigpt batch IN -o OUT --model MODEL ARGV` in-process: exit code, OUT's lines
    parsed (None if OUT was not written), stderr. Nothing may go to stdout."""
    source, target = write_lines(tmp_path / "in.jsonl", lines), tmp_path / "out.jsonl"
    code, out, err = run(capsys, "batch", str(source), "-o", str(target), "--model", model, *argv)
    assert out == ""
    return code, [json.loads(line) for line in target.read_text().splitlines()] if target.exists() else None, err


def environment(hf_home: Path) -> dict[str, str]:
    """This process's environment with the repository importable,
    the hub offline and its cache in `hf_home`."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "HF_HUB_OFFLINE": "1", "HF_HOME": str(hf_home)}


def assert_error(result: tuple[int, str, str], names, exit_code: int = 1) -> None:
    """Exit `exit_code`, nothing on stdout, and exactly one line `error: ...` naming every name."""
    code, out, err = result
    assert "Traceback" not in err
    assert code == exit_code, err
    assert out == ""
    assert err.startswith("error: ") and err.endswith("\n") and err.count("\n") == 1, err
    for name in names:
        assert name in err
