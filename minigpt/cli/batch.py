"""`batch INPUT [-o OUTPUT]`: a JSON Lines file of prompts in, one JSON line of results per prompt out.

The prompts are generated together on an Engine, each bitwise as if alone with the exact kernels.
Every line is checked before any work; results are written in input order as soon as they can be.
"""

from __future__ import annotations

import argparse
import json
import math
import reprlib
import sys
import time
from contextlib import closing, contextmanager
from typing import Callable, Iterator

from tqdm import tqdm

from ..requests.request import OPTIONS, check_against_model, check_options, make_request
from ..requests.token_keys import from_json
from ..engine.engine import MAX_BATCH_SIZE, Engine
from ..engine.job import Job
from ..engine.paging import PAGE
from ..errors import InputError, MinigptError, check_bool, unique_keys
from ..loading.model import Model
from ..loop.sequence import GenerationResult, Request
from ..loading.tokenizer import valid_text
from .flags import (UsageError, add_model_options, add_request_options, as_command_error, encode_prompt, flags,
                    input_chunks, load_model, positive_int, request_options, utf8_text)
from .output import Stream, binary, json_text, print_whole, top_logprobs_json
from . import pictures
from .staircase import check_plot_target, plot_path

LINE_OPTIONS = tuple(name for name, option in OPTIONS.items() if option.batched)  # the request options
KEYS = ("id", "prompt", "prompt_ids", "prompt_logprobs", *LINE_OPTIONS)
SAMPLING_ONLY = ("top_k", "top_p", "seed")  # options that change nothing on a greedy line
# A line holds one prompt, which must fit in a context: 1,024 GPT-2 tokens of at most 128 bytes each are
# 128 KiB, 768 KiB written as \u escapes; ids take 7 bytes each. Each line becomes a request checked
# and kept before any work (a few kB), and 100,000 requests are hours of generation.
MAX_LINE_BYTES = 1 << 20
MAX_LINES = 100_000

DESCRIPTION = """\
Generate a continuation for every line of INPUT, decoding up to B sequences together over one
pool of paged keys and values whose full pages are kept for the prompts that begin alike
(minigpt.engine.scheduler, docs/prefix-cache.md). With the exact kernels every result is bitwise the one
`generate` gives for that prompt alone, with the prefix cache or without. The defaults are
generate's: greedy, stop at end of text."""

EPILOG = f"""\
INPUT: one JSON object per line, UTF-8 (a leading BOM skipped), at most {binary(MAX_LINE_BYTES)} a line and {MAX_LINES:,}
lines; blank lines are skipped (they still count in line numbers).
""" + """\
  {"id": "a", "prompt": "The dog"}
  {"prompt_ids": [464, 3290], "max_new_tokens": 5, "temperature": 0.8, "seed": 1}
  "prompt"          text to continue (GPT-2's tokenizer), or
  "prompt_ids"      token ids to continue: exactly one of the two
  "id"              any string (valid Unicode), number, boolean or null, copied to the output
                    (default: the line number)
  "max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop_at_eos", "stop" (a list
  of strings), "top_logprobs", "logit_bias" (token ids as strings to biases: {"50256": -100}),
  "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens"
                    this line's value of the option of that name (--max-new-tokens, ...);
                    null is the option's default (for top_k, top_p, seed or stop: off) for the
                    line (an option given on the command line that no line takes, or for top_k,
                    top_p and seed only greedy lines take, is an error: it would change nothing)
  "prompt_logprobs" true: also score the prompt (its tokens' log-probabilities, and with
                    top_logprobs their most likely alternatives); default false
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
  "cached_tokens"   prompt positions whose keys and values came from the prefix cache
  "logprobs"        each new token's log-probability under the model's raw distribution
  "top_logprobs"    only when top_logprobs N > 0: per token, the N most likely, most likely first,
                    as {"id", "token", "logprob"} (as generate --json and the OpenAI API write
                    them; "token" is the id's text, null with "text")
  "prompt_logprobs" only with "prompt_logprobs": true: [null, log P(prompt[1] | prompt[:1]), ...],
                    bitwise what `score` gives; "prompt_top_logprobs" too with top_logprobs N > 0

stderr: a progress bar (tqdm: finished requests, tokens/s; TQDM_DISABLE=1 hides it), then a
summary: requests, tokens, wall time, tokens/s, peak pages in use (and their bytes), preemptions,
prompt tokens taken from the prefix cache.
Ctrl-C stops with exit status 130; every line already written is whole (one being written when
the signal comes, or SIGTERM's or SIGHUP's, is finished first, even into a slow pipe).
"""


def add_parser(sub) -> None:
    p = sub.add_parser("batch", help="generate for every prompt of a JSON Lines file, many at once",
                       description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="INPUT", help="JSON Lines file of prompts; - reads stdin")
    p.add_argument("-o", "--output", default="-", metavar="OUTPUT",
                   help="JSON Lines file of results; - (the default) writes stdout")
    add_model_options(p)
    p.add_argument("--max-batch-size", type=positive_int, default=MAX_BATCH_SIZE, metavar="B",
                   help=f"decode at most B sequences together (default {MAX_BATCH_SIZE})")
    p.add_argument("--kv-cache-tokens", type=positive_int, default=None, metavar="T",
                   help=f"the pool of keys and values holds T positions, in pages of {PAGE} (default: B whole "
                        "contexts; at most one per prompt); when it runs short, sequences are preempted and "
                        "recomputed exactly")
    p.add_argument("--no-prefix-cache", action="store_true",
                   help="compute every prompt in full: no keys and values are reused between prompts that begin "
                        "alike (with the exact kernels the results are the same either way)")
    add_request_options(p, batched=True)
    p.add_argument("--plot", type=plot_path, metavar="PATH",
                   help="also draw the page pool over the run to PATH (matplotlib): pages in use, kept by the "
                        "prefix cache and free at each step, preemptions and evictions marked")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    values, given = request_options(args)  # checked once, now, before the model is loaded and INPUT read
    if args.plot is not None:
        check_plot_target(args.plot)
    model = load_model(args)
    tokenizer = model.tokenizer  # now, before any work: text prompts, stop strings and the output's text need it
    check_against_model(model, values)  # an option's fault, not the first line's
    ids, jobs, engine = checked_requests(model, args, values, given)
    pool = engine.pool
    clock = time.perf_counter()
    pending: dict[int, GenerationResult] = {}  # finished, waiting for the lines before them
    written = tokens = preemptions = cached = 0
    samples: list[dict] = []  # the pool after each step, for --plot
    with output(args.output) as out, progress(len(jobs)) as (bar, on_step), \
            closing(engine.results(jobs, lambda n: (on_step(n), samples.append(engine.stats())))) as finished:
        for i, result in finished:  # in the order they finish
            bar.update(1)
            tokens, preemptions = tokens + len(result.tokens), preemptions + result.preemptions
            cached += result.cached_tokens
            pending[i] = result
            while written in pending:  # release in input order, each line whole (print_whole)
                print_whole(json_text(as_json(ids[written], pending.pop(written), tokenizer)), out)
                written += 1
    seconds = time.perf_counter() - clock
    if args.plot is not None and samples:  # no sample: said below, once the summary is out
        pictures.pool(samples, args.plot, f"{args.model}: {len(jobs)} prompts, B = {engine.max_batch_size}, "
                                          f"{pool.n_pages} pages of {PAGE} positions")
    print(f"{len(jobs)} requests, {tokens:,} tokens, {seconds:.3f} s, {tokens / seconds:,.1f} tokens/s, "
          f"peak {pool.peak_in_use:,} of {pool.n_pages:,} pages in use "
          f"({binary(pool.peak_in_use * pool.page_bytes)} of keys and values), {preemptions} preemptions, "
          f"{cached:,} prompt tokens from the prefix cache",
          file=sys.stderr)
    if args.plot is not None and not samples:  # the output is whole; the picture asked for is not there
        raise MinigptError(f"--plot: nothing to draw, no engine step ran (no line generates or scores a token), "
                           f"so {str(args.plot)!r} is not written")
    return 0


def checked_requests(model: Model, args: argparse.Namespace, values: dict,
                     given: set[str]) -> tuple[list, list[Job], Engine]:
    """Every line of INPUT checked, before any work: the lines' ids, their jobs (each scoring its
    prompt if the line asks), and the engine whose pool they all fit in. A bad line fails the run, and so
    does a command-line option (`given`) that no line takes (--seed when every line is greedy or
    has its own seed)."""
    name = "stdin" if args.input == "-" else args.input
    own = flags(args.parser)
    key = lambda keyword: keyword if keyword in KEYS else own.get(keyword, keyword)  # noqa: E731
    numbers, ids, requests, scoring, used = [], [], [], [], set()
    for number, text in read_lines(args.input, name):  # each line parsed as it comes, its text then dropped
        try:
            identity, request, scores, taken = parse_line(model, text, number, values)
        except MinigptError as e:
            raise as_command_error(e, args.parser, key, f"{name} line {number}: ") from None
        numbers.append(number)
        ids.append(identity)
        requests.append(request)
        scoring.append(scores)
        used |= {k for k in taken if k not in SAMPLING_ONLY or request.sampling.temperature > 0}
    for option in (name for name in OPTIONS if name in given):
        if requests and option not in used:
            reason = "every line is greedy (temperature 0) or has" if option in SAMPLING_ONLY else "every line has"
            raise UsageError(f"argument {own[option]}: has no effect: {reason} a {option} of its own")
    at_once = min(args.max_batch_size, max(1, len(requests)))  # the pool holds what the batch can at once
    engine = Engine(model, max_batch_size=at_once, kv_cache_tokens=args.kv_cache_tokens,
                    prefix_cache=not args.no_prefix_cache)
    try:
        jobs = engine.jobs_for(requests, scoring)
    except InputError as e:  # e.prompt: the request's index
        raise as_command_error(e, args.parser, key, f"{name} line {numbers[e.prompt]}: ") from None
    return ids, jobs, engine


def read_lines(path: str, name: str) -> Iterator[tuple[int, str]]:
    """INPUT's lines that are not blank, each with its number (from 1), yielded as they come and
    bounded: a line of at most MAX_LINE_BYTES, at most MAX_LINES lines, so that an input that never
    ends (/dev/zero, `yes`) is refused after a bounded read, never read until memory runs out."""
    pending, number = b"", 0
    for chunk in input_chunks(path, "INPUT"):
        *complete, pending = (pending + chunk).split(b"\n")
        for at, raw in enumerate([*complete, pending], start=number + 1):
            if len(raw) > MAX_LINE_BYTES:
                raise UsageError(f"{name} line {at} is longer than {MAX_LINE_BYTES:,} bytes ({binary(MAX_LINE_BYTES)}): no "
                                 "prompt that fits in a context needs as many")
        for raw in complete:
            number += 1
            if raw.strip():
                yield number, utf8_text(raw, f"{name} line {number}")
        if number > MAX_LINES:
            raise UsageError(f"{name} has more than {MAX_LINES:,} lines, more than one run takes; split it")
    if pending.strip():
        yield number + 1, utf8_text(pending, f"{name} line {number + 1}")


def parse_line(model: Model, text: str, number: int, defaults: dict) -> tuple[object, Request, bool, set[str]]:
    """One line checked: its id (default: its number), its request over the command line's checked
    `defaults`, whether it scores its prompt, and the options it takes from the command line."""
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
        raise InputError(f"id must be a string, finite number, boolean or null, got {reprlib.repr(identity)}")
    if isinstance(identity, str) and valid_text(identity) != identity:  # JSON can spell "\ud800"
        raise InputError(f"id must be valid Unicode text, got {reprlib.repr(identity)}, a lone surrogate: "
                         "written out it would be U+FFFD, as another id's may be")
    if "prompt" in line and not isinstance(line["prompt"], str):
        raise InputError(f'prompt must be a string (token ids go in "prompt_ids"), got {reprlib.repr(line["prompt"])}')
    prompt = encode_prompt(model, line["prompt"]) if "prompt" in line else line["prompt_ids"]
    own = {key: OPTIONS[key].default if line[key] is None else from_json(key, line[key])  # null: the default
           for key in LINE_OPTIONS if key in line}
    taken = {key for key in LINE_OPTIONS if key not in line}
    scores = check_bool(line.get("prompt_logprobs", False), "prompt_logprobs")
    return identity, make_request(model, prompt, check_options(own, defaults), False), scores, taken


@contextmanager
def output(path: str) -> Iterator[Stream]:
    """OUTPUT opened for writing (stdout for -), only once every line of the input has been checked.
    A write that fails (a full disk, /dev/full) is an error naming OUTPUT, as stdout's are."""
    if path == "-":
        yield sys.stdout
        return
    def failed(e: OSError):
        raise MinigptError(f"cannot write OUTPUT {path}: {e.strerror or e}") from None

    if path == "":
        raise UsageError("OUTPUT is an empty path: name a file, or - for stdout")
    try:
        file = open(path, "w", encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot write OUTPUT {path}: {e.strerror or e}") from None
    try:
        with file:
            yield Stream(file, failed)
    except OSError as e:  # closing it
        failed(e)


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
    line = {"id": identity, "prompt_ids": result.prompt_ids, "tokens": result.tokens, "text": result.text,
            "finish_reason": result.finish_reason, "preemptions": result.preemptions,
            "cached_tokens": result.cached_tokens, "logprobs": result.logprobs}
    if result.top_logprobs is not None:
        line["top_logprobs"] = top_logprobs_json(tokenizer, result.top_logprobs)
    if result.prompt_logprobs is not None:
        line["prompt_logprobs"] = result.prompt_logprobs
    if result.prompt_top_logprobs is not None:
        line["prompt_top_logprobs"] = [None, *top_logprobs_json(tokenizer, result.prompt_top_logprobs[1:])]
    return line
