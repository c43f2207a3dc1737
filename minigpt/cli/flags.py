"""The flags several commands share, read and checked before any work: the model's, each request
option's (minigpt.requests.request.OPTIONS), argparse types with bounds, the files a flag names (read
with a bound), and a library error worded as the command names its flags."""

from __future__ import annotations

import argparse
import codecs
import sys
from contextlib import nullcontext
from typing import Callable, Iterator

from ..errors import InputError, MinigptError
from ..exact.kernels import KERNELS
from ..loading.loader import load
from ..loading.model import Model
from ..loading.tokenizer import encode, no_tokenizer
from ..requests.request import OPTIONS, check_options
from ..requests.token_keys import by_token
from ..requests.structured import MAX_CONSTRAINT_CHARS
from .output import binary


class UsageError(InputError):
    """A mistake in how a command was called that argparse cannot see: exit 2, as argparse's own."""


def flags(parser: argparse.ArgumentParser) -> dict[str, str]:
    """A command's flags by the keyword they set (stop_at_eos -> --no-stop, kv_cache_tokens -> --kv-cache-tokens)."""
    return {action.dest: max(action.option_strings, key=len) for action in parser._actions if action.option_strings}


def as_command_error(error: MinigptError, parser: argparse.ArgumentParser,
                     name: Callable[[str], str] | None = None, where: str = "") -> MinigptError:
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
    skipped; read faults are usage errors naming the `option` and the path."""
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


def read_text(path: str, option: str, limit: int, why: str) -> str:
    """The UTF-8 text of the file at `path`, refused as soon as it passes `limit` bytes (`why`: what
    that bound is), so /dev/zero is one usage error after a bounded read."""
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


def bounded(parse, ok, requirement: str):
    """An argparse type: `parse` the text, then refuse values not `ok` as a usage error naming the option."""
    def convert(text: str):
        value = parse(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text}")
        return value

    convert.__name__ = parse.__name__  # argparse's "invalid int value: 'x'" names the type by it
    return convert


positive_int = bounded(int, lambda v: v >= 1, ">= 1")
non_negative_int = bounded(int, lambda v: v >= 0, ">= 0")


def read_as(kind: type):
    """An argparse type: a flag's text as an int or float when it reads as one, else the text itself,
    which the option's check refuses naming it (one check, minigpt.requests.request)."""
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
    """A flag for each request option (minigpt.requests.request.OPTIONS; batched: those many prompts
    take), with its help and default. A flag not given is None: `request_options` keeps only those given."""
    for option in OPTIONS.values():
        if batched and not option.batched:
            continue
        default = "" if option.default in (None, True, False) else f" (default {option.default})"
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
                           metavar=FILES.get(option.name, METAVARS[option.kind]), help=option.help + where + default)


def request_options(args: argparse.Namespace) -> tuple[dict, set[str]]:
    """The request options, checked once, before any work: every keyword's value (defaults for those
    not given), and the keywords given on the command line."""
    given = {name: getattr(args, name) for name in OPTIONS if getattr(args, name, None) is not None}
    if "logit_bias" in given:
        given["logit_bias"] = by_token(given["logit_bias"], "logit_bias")  # one ID=BIAS per token
    for name in FILES.keys() & given.keys():
        text = given[name]
        if name != "json_schema" or not text.lstrip().startswith("{"):  # a schema's JSON is an object
            given[name] = read_text(text, OPTIONS[name].flag, MAX_CONSTRAINT_FILE_BYTES, "more than a constraint's "
                                    f"{MAX_CONSTRAINT_CHARS:,} characters take")
    return check_options(given), set(given)


def encode_prompt(model: Model, text: str) -> list[int]:
    """The prompt's GPT-2 token ids; a model with another vocabulary has no tokenizer to use."""
    if model.tokenizer is None:
        raise InputError(no_tokenizer(model.config.vocab_size))
    return encode(model.tokenizer, text)
