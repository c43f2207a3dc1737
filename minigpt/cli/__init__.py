"""`python -m minigpt COMMAND ...`: one module per command, each with `add_parser` and `run`; the
flags several share are minigpt.cli.flags, what they print minigpt.cli.output.

Every user mistake and detected fault becomes one line `error: ...` on stderr and a non-zero exit
(2 for usage, 1 otherwise); Ctrl-C stops with exit 130, keeping whatever was already printed.
The standard streams are set up here, once for every command: text survives any stdout encoding
(a character it cannot show becomes `?`; JSON is ASCII), output that cannot be written (stdout
closed, full or read-only) is a fault like any other, and a stderr that cannot be written (the
progress bars', the summaries') never turns success into failure.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import sys
from contextlib import contextmanager, suppress
from typing import Iterator

from ..errors import MinigptError
from . import batch, cost, generate, inspect, prove, score, serve, staircase, tune
from .flags import UsageError, as_command_error
from .output import Stream

COMMANDS = (generate, batch, score, prove, inspect, staircase, cost, tune, serve)


class OutputError(MinigptError):
    """stdout cannot take the output: closed (`>&-`), full (`/dev/full`, a full disk) or read-only."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


class Version(argparse.Action):
    """--version: the installed package's version (setup.cfg's), looked up only when asked."""

    def __init__(self, option_strings, dest, **_):
        super().__init__(option_strings, dest, nargs=0, help="print minigpt's version and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        if sys.stdout is None:
            raise OutputError("stdout is closed: there is nowhere to print the version")
        try:
            version = importlib.metadata.version("minigpt")
        except importlib.metadata.PackageNotFoundError:
            version = "(version unknown: not installed; see setup.cfg)"
        print("minigpt", version)
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="python -m minigpt", description="GPT-2 inference in NumPy, exact KV cache.")
    parser.add_argument("--version", action=Version)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for command in COMMANDS:
        command.add_parser(sub)
    for command_parser in sub.choices.values():
        command_parser.set_defaults(parser=command_parser)  # for errors that point to the command's --help
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status: 0 done, 1 a fault, 2 a usage error, 130 Ctrl-C (argparse's
    own usage errors, --help and --version end in SystemExit, as argparse does)."""
    with standard_streams():
        try:
            return run(argv)
        except MinigptError as e:
            with suppress(OutputError, OSError):  # a broken pipe too
                flush_stdout()  # what was printed, then the error
            print("error:", " ".join(str(e).splitlines()), file=sys.stderr)  # always one line
            return 2 if isinstance(e, UsageError) else 1
        except KeyboardInterrupt:
            with suppress(OutputError, OSError):  # a broken pipe too
                flush_stdout()
            print(file=sys.stderr)  # end the line the terminal's ^C began
            return 130
        except BrokenPipeError:  # e.g. piped into `head`: stop quietly
            return 1


def run(argv: list[str] | None) -> int:
    """Parse, run the command, and write out all of its output: a success whose output is lost is none."""
    try:
        args, unknown = build_parser().parse_known_args(argv)
        if unknown:
            args.parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    except SystemExit:  # argparse: --help, --version or a usage error, already printed
        flush_stdout()
        raise
    if sys.stdout is None and getattr(args, "output", "-") == "-":  # only `batch -o FILE` can do without it
        raise OutputError("stdout is closed: there is nowhere to print the output")
    try:
        status = args.run(args)
    except MinigptError as e:  # the library names arguments by their keywords: a command by its flags
        command_error = as_command_error(e, args.parser)
        if command_error is e:
            raise
        raise command_error from None
    flush_stdout()
    return status


def flush_stdout() -> None:
    if sys.stdout is not None:
        sys.stdout.flush()


@contextmanager
def standard_streams() -> Iterator[None]:
    """sys.stdout and sys.stderr for one command (see the module docstring); as they were afterwards."""
    stdout, stderr = sys.stdout, sys.stderr
    errors = getattr(stdout, "errors", None)
    if hasattr(stdout, "reconfigure"):
        stdout.reconfigure(errors="replace")  # ascii, latin-1, LANG=C: "?" for what the encoding lacks
    closed_stderr = open(os.devnull, "w") if stderr is None else None  # else print(file=None) goes to stdout
    if stdout is not None:
        sys.stdout = Stream(stdout, output_error)
    sys.stderr = Stream(stderr or closed_stderr, lambda error: None)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = stdout, stderr
        if closed_stderr is not None:
            closed_stderr.close()
        if hasattr(stdout, "reconfigure"):
            with suppress(OSError):
                stdout.reconfigure(errors=errors)


def output_error(error: OSError):
    if isinstance(error, BrokenPipeError):
        raise error
    raise OutputError(f"cannot write to stdout: {error.strerror or error}") from None
