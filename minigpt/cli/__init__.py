"""`python -m minigpt COMMAND ...`: one module per command, each with `add_parser` and `run`.

Every user mistake and detected fault becomes one line `error: ...` on stderr and a non-zero exit
(2 for usage, 1 otherwise); Ctrl-C stops with exit 130, keeping whatever was already printed.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..errors import MinigptError
from . import batch, cost, generate, prove, score, staircase
from .common import UsageError

COMMANDS = (generate, batch, score, prove, staircase, cost)


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m minigpt", description="GPT-2 inference in NumPy, exact KV cache.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except MinigptError as e:
        sys.stdout.flush()
        print("error:", " ".join(str(e).splitlines()), file=sys.stderr)  # always one line
        return 2 if isinstance(e, UsageError) else 1
    except KeyboardInterrupt:
        sys.stdout.flush()
        print(file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. piped into `head`: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
