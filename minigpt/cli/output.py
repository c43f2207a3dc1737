"""What commands print: JSON (ASCII, valid Unicode, never NaN), text tables, byte counts, and whole
lines written to the last byte with signals held, to a stream whose failed writes are errors."""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import threading
from contextlib import contextmanager, suppress
from typing import IO, Callable, Iterator

from ..errors import MinigptError
from ..loading.tokenizer import token_text, valid_text


def binary(n: float) -> str:
    """A byte count in KiB / MiB / GiB (powers of 1024), as memory is sized."""
    for prefix, scale in (("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
        if n >= scale:
            return f"{n / scale:,.4g} {prefix}"
    return f"{n:g} B"


def top_logprobs_json(tokenizer, top_logprobs: list[list[tuple[int, float]]]) -> list[list[dict]]:
    """Per token, its most likely alternatives as {"id", "token", "logprob"} objects, as OpenAI's
    top_logprobs ("token" null for a model without GPT-2's tokenizer)."""
    return [[{"id": t, "token": None if tokenizer is None else token_text(tokenizer, t), "logprob": lp}
             for t, lp in step] for step in top_logprobs]


def table(rows: list[list[str]], numbers: tuple[int, ...] = ()) -> list[str]:
    """The lines of a text table, columns two spaces apart; the columns numbered in `numbers`
    right-aligned, the others left-aligned."""
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
    been; SIGQUIT is left alone, a way out of a write no reader takes. Main thread only."""
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
    is acted on, so every output holds only whole lines (docs/loading.md)."""
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
        """`text` written to the last byte, os.write until every byte is out (python -u would drop
        the rest); a non-blocking descriptor is waited on while it is full."""
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
