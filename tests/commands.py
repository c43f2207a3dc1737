"""The command line in-process, for the tests that run it: exit code, stdout and stderr."""

from __future__ import annotations

from minigpt.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """`python -m minigpt ARGV` in-process (argparse's usage errors too): exit code, stdout, stderr."""
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse's usage errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err
