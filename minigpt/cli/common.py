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
from ..loading.tokenizer import encode, no_tokenizer, token_text, valid_text
from ..loading.options import OPTIONS, by_token, check_options
from ..loading.structured import MAX_CONSTRAINT_CHARS


class UsageError(InputError):
    """A mistake in how a command was called that argparse cannot see (an input that cannot be
    read or holds a bad line, an option the model cannot take): one line `error: ...` and exit 2,
    as argparse's own usage errors."""


def flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """A command's flags by the keyword they set (stop_at_eos -> --no-stop, kv_cache_tokens -> --kv-cache-tokens)."""
    return {action.dest: max(action.option_strings, key=len) for action in parser._actions if action.option_strings}


def worded(error: MinigptError, parser: argparse.ArgumentParser, name: Callable[[str], str] | None = None,
           where: str = "") -> MinigptError:
    """A library error as a command says it: every argument named by its flag (or by `name`, batch's
    line keys), after `where` ("INPUT line 3: "). One about a flag of the command, and any with a
    `where`, is a usage error (exit 2), the flag's in argparse's words: "argument --top-k: must be ...";
    the others keep their class (exit 1)."""
    own = flags(parser)
    name = name or (lambda keyword: own.get(keyword, keyword))
    if error.param is None and not where:
        return error
    if where or error.param not in own:
        return (UsageError if where else type(error))(where + error.message(name))
    return UsageError(f"argument {own[error.param]}: {error.message(name, subject=False)}")


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


def binary(n: float) -> str:
    """A byte count in KiB / MiB / GiB (powers of 1024), as memory is sized."""
    for prefix, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:,.4g} {prefix}"
    return f"{n:g} B"


def read_text(path: str, option: str, limit: int, why: str) -> str:
    """The UTF-8 text of the file at `path` (as input_chunks reads it), refused as soon as it passes
    `limit` bytes (`why`: what that bound is), so that /dev/zero or a huge file is one usage error
    after a bounded read, never read until memory runs out. Every file a command reads whole comes here."""
    name, data = f"{option} {path!r}", bytearray()
    for chunk in input_chunks(path, option):
        data += chunk
        if len(data) > limit:
            raise UsageError(f"{name} holds more than {binary(limit)}, {why}")
    return utf8_text(bytes(data), name)


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


def read_as(kind: type):
    """An argparse type: a flag's text as an int or float when it reads as one, else the text itself,
    which the option's check refuses naming it (one check, minigpt.loading.options)."""
    def read(text: str):
        try:
            return kind(text)
        except ValueError:
            return text

    read.__name__ = kind.__name__
    return read


def id_and_value(text: str) -> tuple:
    """An argparse type for ID=VALUE (--logit-bias 50256=-100), the value read as a number if it is one."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"must be ID=BIAS (a token id, =, a number), got {text}")
    token, _, value = text.partition("=")
    return token, read_as(float)(value)  # the id as text, read as JSON's keys are (by_token)


METAVARS = {int: "N", float: "X", str: "TEXT", list: "TEXT", dict: "ID=BIAS"}
FILES = {"json_schema": "FILE-or-JSON", "grammar": "FILE"}  # options whose flag names a file (or holds the JSON)
MAX_CONSTRAINT_FILE_BYTES = 4 * MAX_CONSTRAINT_CHARS  # a UTF-8 character takes at most 4 bytes


def add_request_options(p: argparse.ArgumentParser, batched: bool) -> None:
    """A flag for each request option (minigpt.loading.options.OPTIONS; batched: those many prompts
    take), with its help and default. A flag not given is None: `request_options` keeps only those given."""
    for option in OPTIONS.values():
        if batched and not option.batched:
            continue
        shown = "" if option.default in (None, True, False) else f" (default {option.default})"
        if option.kind is bool:
            p.add_argument(option.flag, dest=option.name, action="store_const", const=not option.default,
                           help=option.help)
        elif option.kind in (list, dict):
            p.add_argument(option.flag, dest=option.name, action="append", metavar=METAVARS[option.kind],
                           type=id_and_value if option.kind is dict else str, help=f"{option.help} (repeatable)")
        else:
            where = f" (a file, - for stdin{', or the JSON itself' if option.name == 'json_schema' else ''})" \
                if option.name in FILES else ""
            p.add_argument(option.flag, dest=option.name, type=read_as(option.kind),
                           metavar=FILES.get(option.name, METAVARS[option.kind]), help=option.help + where + shown)


def request_options(args: argparse.Namespace) -> dict:
    """The request options given on the command line, checked before any work (an InputError names
    the option; the command words it as its flag): keyword -> value."""
    given = {name: getattr(args, name) for name in OPTIONS if getattr(args, name, None) is not None}
    if "logit_bias" in given:
        given["logit_bias"] = by_token(given["logit_bias"], "logit_bias")  # one ID=BIAS per token
    for name in FILES.keys() & given.keys():
        text = given[name]
        if name != "json_schema" or not text.lstrip().startswith("{"):  # a schema's JSON is an object
            given[name] = read_text(text, OPTIONS[name].flag, MAX_CONSTRAINT_FILE_BYTES, "more than a constraint's "
                                    f"{MAX_CONSTRAINT_CHARS:,} characters take")
    checked = check_options(given)
    return {name: checked[name] for name in given}


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
    pieces would end the command with part of a line written (65,536 bytes of it); held signals make
    every output hold only whole lines, whatever the signal and the moment. A reader that stops reading
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
        raise InputError(no_tokenizer(model.config.vocab_size))
    return encode(model.tokenizer, text)
