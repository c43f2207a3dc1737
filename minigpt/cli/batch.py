"""`batch INPUT [-o OUTPUT]`: a JSON Lines file of prompts in, one JSON line of results per prompt out.

The prompts are generated together by the continuous-batching scheduler (minigpt.batching): each
as if it were alone, bitwise with the exact kernels, whatever the batch and the preemptions. Every
line is checked before any work; results come back in any order and are written in input order,
each as soon as it and all the lines before it are done.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import reprlib
import sys
import time
from contextlib import closing, contextmanager
from pathlib import Path
from typing import IO, Callable, Iterator

from tqdm import tqdm

from ..api import Engine, make_request
from ..checks import check_stop
from ..errors import InputError, MinigptError
from ..model import Model
from ..safetensors_format import unique_keys
from ..sequence import GenerationResult, Request, generated_text
from .common import (UsageError, add_model_options, add_sampling_options, encode_prompt, json_text, load_model,
                     positive_int)
from .cost import binary

LINE_OPTIONS = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop", "top_logprobs")  # as in the epilog
KEYS = ("id", "prompt", "prompt_ids", *LINE_OPTIONS)
DEFAULT_MAX_BATCH_SIZE = 16

DESCRIPTION = """\
Generate a continuation for every line of INPUT, decoding up to B sequences together over one
pool of paged keys and values (minigpt.batching, docs/paging.md). With the exact kernels every
result is bitwise the one `generate` gives for that prompt alone. The defaults are generate's:
greedy, stop at end of text."""

EPILOG = """\
INPUT: one JSON object per line; blank lines are skipped (they still count in line numbers).
  {"id": "a", "prompt": "The dog"}
  {"prompt_ids": [464, 3290], "max_new_tokens": 5, "temperature": 0.8, "seed": 1}
  "prompt"          text to continue (GPT-2's tokenizer), or
  "prompt_ids"      token ids to continue: exactly one of the two
  "id"              any string, number, boolean or null, copied to the output (default: the
                    line number)
  "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop" (a list of strings),
  "top_logprobs"    this line's value of the option of that name (--max-new-tokens, ...);
                    null for top_k, top_p, seed or stop turns the option off for the line
  Invalid JSON, any other key or a bad value (a type, a range, a token id outside the vocabulary,
  a prompt too long for the context or the pool) fails the whole run before any work with one
  line "error: INPUT line N: ..." and exit status 2; OUTPUT is then not written.

OUTPUT: one JSON object per input line, in input order, each written as soon as it and every line
before it are done (ASCII JSON: other characters as \\u escapes).
  "id"              the input's, or its line number
  "prompt_ids"      the prompt as fed (an empty prompt starts from <|endoftext|>: [50256])
  "tokens"          the new token ids
  "text"            the new text, without the <|endoftext|> that ended it; null when the model's
                    vocabulary is not GPT-2's (it has no tokenizer and takes "prompt_ids" only)
  "finish_reason"   "eos", "length" or "stop"
  "preemptions"     times the scheduler took the sequence's keys and values away to make room
                    (recomputed when it resumed: with the exact kernels, bitwise)
  "logprobs"        each new token's log-probability under the model's raw distribution
  "top_logprobs"    only when top_logprobs N > 0: per token, the N most likely [id, logprob]

stderr: a progress bar (tqdm: finished requests, tokens/s; TQDM_DISABLE=1 hides it), then a
summary: requests, tokens, wall time, tokens/s, peak pages in use (and their bytes), preemptions.
Ctrl-C stops with exit status 130; every line already written is whole.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("batch", help="generate for every prompt of a JSON Lines file, many at once",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="INPUT", help="JSON Lines file of prompts; - reads stdin")
    p.add_argument("-o", "--output", default="-", metavar="OUTPUT",
                   help="JSON Lines file of results; - (the default) writes stdout")
    add_model_options(p)
    p.add_argument("--max-batch-size", type=positive_int, default=DEFAULT_MAX_BATCH_SIZE, metavar="B",
                   help=f"decode at most B sequences together (default {DEFAULT_MAX_BATCH_SIZE})")
    p.add_argument("--kv-cache-tokens", type=positive_int, default=None, metavar="T",
                   help="the pool of keys and values holds T positions, in pages of 16 (default: B whole "
                        "contexts; at most one per prompt); when it runs short, sequences are preempted and "
                        "recomputed exactly")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="compute every prompt in full: no keys and values are reused between prompts that begin "
                        "alike (with the exact kernels the results are the same either way)")
    add_sampling_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    model = load_model(args)
    tokenizer = model.tokenizer  # now, before any work: text prompts, stop strings and the output's text need it
    check_stop(model, args.stop)  # an option's fault, not the first line's
    ids, requests, engine = checked_requests(model, args)
    pool = engine.pool
    clock = time.perf_counter()
    pending: dict[int, GenerationResult] = {}  # finished, waiting for the lines before them
    written = tokens = preemptions = cached = 0
    with output(args.output) as out, progress(len(requests)) as (bar, on_step), \
            closing(engine.results(requests, [False] * len(requests), on_step)) as finished:
        for i, result in finished:  # in the order they finish
            bar.update(1)
            tokens, preemptions = tokens + len(result.tokens), preemptions + result.preemptions
            cached += result.cached_tokens
            pending[i] = result
            while written in pending:  # release in input order, each line in one write
                out.write(json_text(as_json(ids[written], pending.pop(written), tokenizer)) + "\n")
                out.flush()
                written += 1
    seconds = time.perf_counter() - clock
    print(f"{len(requests)} requests, {tokens:,} tokens, {seconds:.3f} s, {tokens / seconds:,.1f} tokens/s, "
          f"peak {pool.peak_in_use:,} of {pool.n_pages:,} pages in use "
          f"({binary(pool.peak_in_use * pool.page_bytes)} of keys and values), {preemptions} preemptions, "
          f"{cached:,} prompt tokens from the prefix cache",
          file=sys.stderr)
    return 0


def checked_requests(model: Model, args: argparse.Namespace) -> tuple[list, list[Request], Engine]:
    """Every line of INPUT checked, before any work: the lines' ids, their requests and the engine
    whose pool they all fit in. The first bad line fails the run (UsageError naming it)."""
    name = "stdin" if args.input == "-" else args.input
    lines = read_lines(args.input, name)
    defaults = {key: getattr(args, key) for key in LINE_OPTIONS}
    ids, requests = [], []
    for number, text in lines:
        try:
            identity, request = parse_line(model, text, number, defaults, not args.no_stop)
        except MinigptError as e:
            raise UsageError(f"{name} line {number}: {e}") from None
        ids.append(identity)
        requests.append(request)
    at_once = min(args.max_batch_size, max(1, len(requests)))  # the pool holds what the batch can at once
    engine = Engine(model, max_batch_size=at_once, kv_cache_tokens=args.kv_cache_tokens,
                    prefix_cache=not args.no_prefix_cache)
    try:
        engine.check_fits(requests)
    except InputError as e:  # "prompt i: ...", i counting the requests
        i, message = re.fullmatch(r"prompt (\d+): (.*)", str(e), re.DOTALL).groups()
        raise UsageError(f"{name} line {lines[int(i)][0]}: {message}") from None
    return ids, requests, engine


def read_lines(path: str, name: str) -> list[tuple[int, str]]:
    """INPUT's lines that are not blank, each with its number (from 1)."""
    if path == "-" and sys.stdin is None:
        raise UsageError("cannot read INPUT -: stdin is closed")
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read INPUT {path}: {e.strerror or e}") from None
    lines = []
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if raw.strip():
            try:
                lines.append((number, raw.decode("utf-8")))
            except UnicodeDecodeError as e:
                raise UsageError(f"{name} line {number}: not UTF-8 text (byte {e.start + 1})") from None
    return lines


def parse_line(model: Model, text: str, number: int, defaults: dict, stop_at_eos: bool) -> tuple[object, Request]:
    """One line checked: its id (default: its number) and its request, with the options it overrides.
    The request's checks are the library's own (make_request); only the JSON shapes are checked here."""
    try:
        line = json.loads(text, object_pairs_hook=unique_keys)
    except json.JSONDecodeError as e:
        raise InputError(f"invalid JSON: {e.msg.removesuffix(' at')} at column {e.colno}") from None
    except ValueError as e:  # a key twice in one object; an integer of more than 4,300 digits
        raise InputError(f"invalid JSON: {str(e).split(';')[0]}") from None  # not Python's advice on its limit
    except RecursionError:
        raise InputError("invalid JSON: nested too deeply") from None
    if not isinstance(line, dict):
        raise InputError(f"a line must be a JSON object {{...}}, got {reprlib.repr(line)}")
    unknown = [key for key in line if key not in KEYS]
    if unknown:
        raise InputError(f"unknown key {json.dumps(unknown[0])}; a line's keys are {', '.join(KEYS)}")
    if ("prompt" in line) == ("prompt_ids" in line):
        raise InputError('a line needs exactly one of "prompt" (text) and "prompt_ids" (token ids)')
    identity = line.get("id", number)
    if isinstance(identity, (list, dict)) or isinstance(identity, float) and not math.isfinite(identity):
        raise InputError(f'"id" must be a string, finite number, boolean or null, got {reprlib.repr(identity)}')
    if "prompt" in line and not isinstance(line["prompt"], str):
        raise InputError(f'"prompt" must be a string (token ids go in "prompt_ids"), '
                         f'got {reprlib.repr(line["prompt"])}')
    prompt = encode_prompt(model, line["prompt"]) if "prompt" in line else line["prompt_ids"]
    options = {**defaults, **{key: line[key] for key in LINE_OPTIONS if key in line}}
    if not isinstance(options["stop"], (list, type(None))):
        raise InputError(f'"stop" must be a list of strings, got {reprlib.repr(options["stop"])}')
    return identity, make_request(model, prompt, stop_at_eos=stop_at_eos, **options)


@contextmanager
def output(path: str) -> Iterator[IO[str]]:
    """OUTPUT opened for writing (stdout for -), only once every line of the input has been checked.
    A write that fails (a full disk, /dev/full) is an error naming OUTPUT, as stdout's are."""
    if path == "-":
        yield sys.stdout
        return
    try:
        file = open(path, "w", encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write OUTPUT {path}: {e.strerror or e}") from None
    try:
        with file:
            yield file
    except OSError as e:
        raise MinigptError(f"cannot write OUTPUT {path}: {e.strerror or e}") from None


@contextmanager
def progress(total: int) -> Iterator[tuple[tqdm, Callable[[int], None]]]:
    """A bar on stderr counting finished requests (the caller updates it) and showing the tokens/s of
    the steps so far, and the scheduler's on_step(new tokens) that feeds the rate."""
    clock, tokens = time.perf_counter(), 0
    with tqdm(total=total, unit="req", miniters=0, smoothing=0, file=sys.stderr) as bar:  # rates: averages
        def on_step(n: int) -> None:
            nonlocal tokens
            tokens += n
            bar.set_postfix_str(f"{tokens / (time.perf_counter() - clock):,.1f} tokens/s", refresh=False)
            bar.update(0)  # redrawn at most every 0.1 s (tqdm's mininterval)

        yield bar, on_step


def as_json(identity, result: GenerationResult, tokenizer) -> dict:
    """One output line (see the epilog)."""
    line = {"id": identity, "prompt_ids": result.prompt_ids, "tokens": result.tokens,
            "text": None if tokenizer is None else generated_text(tokenizer, result),
            "finish_reason": result.finish_reason, "preemptions": result.preemptions, "logprobs": result.logprobs}
    if result.top_logprobs is not None:
        line["top_logprobs"] = result.top_logprobs
    return line
