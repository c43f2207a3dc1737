"""Options shared by several commands."""

from __future__ import annotations

import argparse
import codecs
import json
import math
import os
import select
import signal
import sys
import threading
from contextlib import contextmanager, nullcontext, suppress
from typing import IO, Callable, Iterator

from ..errors import InputError, MinigptError
from ..exact.kernels import KERNELS
from ..loading.loader import load
from ..loading.model import Model
from ..loop.sampling import MAX_TOP_LOGPROBS
from ..loading.tokenizer import encode, token_text, valid_text


class UsageError(InputError):
    """A mistake in how a command was called that argparse cannot see (an input that cannot be
    read or holds a bad line, an option the model cannot take): one line `error: ...` and exit 2,
    as argparse's own usage errors."""


def check_option(option: str, check, *args):
    """`check(*args)`, a library check of one option's value; its InputError becomes a usage error
    naming the option as the user gave it (`stride must be ...` -> `argument --stride: ...`)."""
    try:
        return check(*args)
    except InputError as e:
        raise UsageError(f"argument {option}: {e}") from None


CHUNK = 1 << 16


def input_chunks(path: str, option: str) -> Iterator[bytes]:
    """The bytes of the file at `path` (`-`: stdin) in chunks as they arrive, a leading UTF-8 BOM
    skipped (as the utf-8-sig codec does). Anything that can be read works: a file, a pipe,
    /dev/stdin, a process substitution <(...); a device that never ends is the caller's to bound
    (it stops reading at its limit). Read faults are usage errors naming the `option` and the path."""
    if path == "":
        raise UsageError(f"{option} is an empty path: name a file, or - for stdin")
    if path == "-" and sys.stdin is None:
        raise UsageError(f"cannot read {option} -: stdin is closed")
    name = f"{option} {path!r}"
    try:
        with nullcontext(sys.stdin.buffer) if path == "-" else open(path, "rb") as source:
            chunk = source.read(CHUNK).removeprefix(codecs.BOM_UTF8)
            while chunk:
                yield chunk
                chunk = source.read(CHUNK)
    except OSError as e:
        raise UsageError(f"cannot read {name}: {e.strerror or e}") from None


def utf8_text(data: bytes, name: str) -> str:
    """`data` decoded as UTF-8, or a usage error naming `name` and the first bad byte, counted from 1
    (after a leading BOM) as editors count columns and cmp counts bytes."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{name} is not UTF-8 text: byte {e.start + 1} is {data[e.start]:#04x}") from None


def add_model_options(p: argparse.ArgumentParser, default: str = "gpt2") -> None:
    p.add_argument("--model", default=default,
                   help=f"checkpoint directory, alias (gpt2, gpt2-medium, ...), hub id, random-124m or random-tiny "
                        f"(default: {default})")
    p.add_argument("--kernels", choices=list(KERNELS), default="exact",
                   help="exact: row-invariant, cache bitwise exact (default); fast: plain BLAS")


def load_model(args: argparse.Namespace) -> Model:
    return load(args.model, kernels=args.kernels)


def checked(parse, ok, requirement: str):
    """An argparse type: `parse` the text, then refuse values not `ok` as a usage error naming the option."""
    def convert(text: str):
        value = parse(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text}")
        return value

    convert.__name__ = parse.__name__  # argparse's "invalid int value: 'x'" names the type by it
    return convert


positive_int = checked(int, lambda v: v >= 1, ">= 1")
non_negative_int = checked(int, lambda v: v >= 0, ">= 0")
non_negative_float = checked(float, lambda v: 0 <= v < math.inf, "a finite number >= 0")  # NaN fails too
probability = checked(float, lambda v: 0 < v <= 1, "in (0, 1]")
top_count = checked(int, lambda v: 0 <= v <= MAX_TOP_LOGPROBS, f"in 0..{MAX_TOP_LOGPROBS}")


def add_sampling_options(p: argparse.ArgumentParser) -> None:
    """The options of a generation request, with `generate`'s defaults: greedy, stop at end of text."""
    p.add_argument("--max-new-tokens", type=non_negative_int, default=40,
                   help="at most this many new tokens (default 40)")
    p.add_argument("--temperature", type=non_negative_float, default=0.0,
                   help="0 is greedy (default); higher samples more freely")
    p.add_argument("--top-k", type=positive_int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=probability, default=None,
                   help="sample among the smallest set holding this probability")
    p.add_argument("--seed", type=non_negative_int, default=None, help="a seed makes sampling reproducible")
    p.add_argument("--no-stop", action="store_true", help="keep going past <|endoftext|>")
    p.add_argument("--stop", action="append", metavar="TEXT",
                   help="end the text before this string; the tokens run to the one that completes it "
                        "(repeatable: the first found ends)")
    p.add_argument("--top-logprobs", type=top_count, default=0, metavar="N",
                   help=f"also record the N most likely tokens at each step with their log-probabilities "
                        f"(in JSON output; N at most {MAX_TOP_LOGPROBS}, as the OpenAI API allows)")


def top_logprobs_json(tokenizer, top_logprobs: list[list[tuple[int, float]]]) -> list[list[dict]]:
    """Per token, its most likely alternatives as {"id", "token", "logprob"} objects, the shape of
    the OpenAI API's top_logprobs: a script reads each field by name, and a field can be added
    without breaking it (an [id, logprob] pair would be read by position). "token" is the id's
    text (bytes that are not UTF-8 replaced), null for a model without GPT-2's tokenizer."""
    return [[{"id": t, "token": None if tokenizer is None else token_text(tokenizer, t), "logprob": lp}
             for t, lp in step] for step in top_logprobs]


def table(rows: list[list[str]], numbers: tuple[int, ...] = ()) -> list[str]:
    """The lines of a text table: each column as wide as its widest cell, columns two spaces apart;
    the columns numbered in `numbers` hold numbers and are right-aligned, the others text, left-aligned.
    Every command's tables are laid out here."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    align = [">" if i in numbers else "<" for i in range(len(widths))]
    return ["  ".join(f"{cell:{a}{w}}" for cell, a, w in zip(row, align, widths)).rstrip() for row in rows]


def print_json(document: dict) -> None:
    """`document` as indented JSON on stdout (see json_text)."""
    print_whole(json_text(document, indent=2))


HELD_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP held back while the block runs, then acted on as they would have
    been (KeyboardInterrupt, or the default action: the process ends by that signal). SIGQUIT
    (Ctrl-\\) is left alone: it stops at once, a way out of a write no reader takes. Only the main
    thread can set handlers, and only it receives them: elsewhere the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {s: signal.getsignal(s) for s in HELD_SIGNALS}
    previous = {s: handler for s, handler in previous.items() if handler is not None}  # None: set outside Python
    for s in previous:
        signal.signal(s, lambda signum, frame: held.append(signum))
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in dict.fromkeys(held):
            signal.raise_signal(s)


def print_whole(text: str, stream: Stream | None = None) -> None:
    """`text` and a newline written to `stream` (default stdout) to the last byte before any signal
    is acted on. A pipe whose reader is slow takes a long line in pieces, and a signal between two
    pieces used to end the command with part of a line written (65,536 bytes of it); now every
    output holds only whole lines, whatever the signal and the moment. A reader that stops reading
    keeps the command waiting, as it would any writer; closing it ends the command."""
    with signals_held():
        (sys.stdout if stream is None else stream).write_whole(text + "\n")


class Stream:
    """An output stream whose failed writes and flushes go to `failed` (stdout's raise OutputError,
    stderr's are dropped, OUTPUT's name it); its descriptor then points to /dev/null, so that nothing
    fails twice, not even Python's last flush at exit (which would turn the exit status into 120)."""

    def __init__(self, stream: IO[str], failed: Callable[[OSError], None]):
        self.stream, self.failed = stream, failed

    def write(self, text: str):
        return self.guard(self.stream.write, text)

    def flush(self) -> None:
        self.guard(self.stream.flush)

    def write_whole(self, text: str) -> None:
        """`text` written to the last byte, with os.write on the descriptor until every byte is out
        (a signal makes a pipe take fewer, and an unbuffered stream, python -u, would drop the rest).
        A descriptor made non-blocking by whoever made the pipe is waited on while it is full."""
        self.guard(self._write_whole, text)

    def _write_whole(self, text: str) -> None:
        self.stream.flush()  # what was written before comes first
        try:
            descriptor = self.stream.fileno()
        except (OSError, ValueError):  # an in-memory stream (tests) takes it in one call
            self.stream.write(text)
            return self.stream.flush()
        data = memoryview(text.encode(self.stream.encoding or "utf-8", self.stream.errors or "strict"))
        while data:
            try:
                data = data[os.write(descriptor, data):]
            except BlockingIOError:
                select.select([], [descriptor], [])

    def guard(self, call, *args):
        try:
            return call(*args)
        except OSError as error:
            with suppress(OSError, ValueError, AttributeError):  # a stream without a descriptor (tests)
                descriptor = self.stream.fileno()
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, descriptor)
                os.close(null)
            return self.failed(error)

    def __getattr__(self, name: str):  # encoding, isatty, fileno, ...: the stream's own
        return getattr(self.stream, name)


def json_text(document: dict, indent: int | None = None) -> str:
    """`document` as JSON: ASCII (\\u escapes), so any stdout encoding carries it; valid Unicode, so
    any parser reads it (an argument's undecodable bytes are replaced, as in valid_text); and never
    NaN or Infinity, which are not JSON (the commands put none in: this is a guard)."""
    try:
        return json.dumps(valid_strings(document), indent=indent, allow_nan=False)
    except ValueError as e:
        raise MinigptError(f"the output would not be valid JSON: {e}") from None


def valid_strings(value):
    """`value` (JSON-like: dicts, lists, strings, numbers) with every string made valid Unicode."""
    if isinstance(value, str):
        return valid_text(value)
    if isinstance(value, dict):
        return {valid_strings(key): valid_strings(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [valid_strings(item) for item in value]
    return value


def encode_prompt(model: Model, text: str) -> list[int]:
    """The prompt's GPT-2 token ids; a model with another vocabulary has no tokenizer to use."""
    if model.tokenizer is None:
        raise InputError(f"this model's vocabulary has {model.config.vocab_size} tokens, not GPT-2's "
                         "50257, so it has no tokenizer for a text prompt")
    return encode(model.tokenizer, text)
