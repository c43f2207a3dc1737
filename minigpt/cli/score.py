"""`score TEXT` or `score --file PATH`: the log-probability of every token of a text, and its perplexity."""

from __future__ import annotations

import argparse

import numpy as np

from ..loading.model import Model
from ..api.api import score
from ..loading.checks import check_stride
from ..loading.tokenizer import token_text
from .flags import add_model_options, encode_prompt, load_model, positive_int, read_text
from .output import print_json, print_whole, table

# --file's bound: about a million GPT-2 tokens, an hour and more of windows for GPT-2 small on two cores,
# and a few hundred MB of per-token results; wikitext-2's test split (1.3 MB), the usual perplexity
# benchmark, fits three times. Anything longer (/dev/zero, a stream that never ends) is refused after
# reading that much, not read until memory runs out.
MAX_FILE_BYTES = 4 << 20


def add_parser(sub) -> None:
    p = sub.add_parser("score", help="log-probability and perplexity of a text",
                       description="Score a text: for every token after the first, its log-probability (in "
                                   "nats) given the tokens before it; then their total, mean, and the perplexity "
                                   "exp(-mean). A text of more than n_positions + 1 tokens is scored in windows "
                                   "of n_positions tokens, each scoring the next --stride tokens, each token once "
                                   "(docs/sampling.md).")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("text", nargs="?", metavar="TEXT", help="the text to score")
    source.add_argument("--file", metavar="PATH",
                        help=f"score this UTF-8 text file instead (- reads stdin; at most {MAX_FILE_BYTES >> 20} MiB)")
    add_model_options(p)
    p.add_argument("--stride", type=positive_int, default=None, metavar="N",
                   help="for texts longer than the context: each window after the first scores the next N "
                        "tokens with the n_positions before the last as context (1 .. n_positions; default "
                        "n_positions // 2; n_positions: lm-eval's rolling windows)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    text = args.text if args.file is None else read_text(
        args.file, "--file", MAX_FILE_BYTES, "more than one scoring run takes (about a million tokens); score it in parts")
    model = load_model(args)
    stride = check_stride(args.stride, model.config.n_positions)
    ids = encode_prompt(model, text)
    document = as_json(args, model, ids, stride, score(model, ids, stride))
    if args.json:
        print_json(document)
    else:
        print_whole(report(document))
    return 0


def as_json(args: argparse.Namespace, model: Model, ids: list[int], stride: int, logprobs: np.ndarray) -> dict:
    """The scores and their summary; logprobs[i] belongs to tokens[i + 1]."""
    total = float(logprobs.sum())
    mean = total / logprobs.size
    with np.errstate(over="ignore"):  # inf for a mean below -709 nats (weights scaled far beyond a real model's)
        perplexity = float(np.exp(-mean))
    perplexity = perplexity if np.isfinite(perplexity) else None  # JSON has no inf: null
    return {"model": args.model, "kernels": args.kernels, "stride": stride,
            "n_positions": model.config.n_positions, "tokens": ids,
            "token_texts": [token_text(model.tokenizer, t) for t in ids],
            "logprobs": logprobs.tolist(), "total_logprob": total, "mean_logprob": mean, "perplexity": perplexity}


def report(d: dict) -> str:
    """A row per token (its text as a Python string literal: newlines and control characters escaped)."""
    n, windows = len(d["tokens"]), d["n_positions"]
    perplexity = "inf (beyond float64)" if d["perplexity"] is None else f"{d['perplexity']:.4g}"
    rows = [[f"{i}", f"{token}", repr(text), "-" if logprob is None else f"{logprob:.4f}"]
            for i, (token, text, logprob) in enumerate(zip(d["tokens"], d["token_texts"], [None, *d["logprobs"]]))]
    lines = [f"{d['model']} ({d['kernels']} kernels): {n} tokens, {n - 1} scored (the first is only context)"
             + (f"; windows of {windows} tokens scoring {d['stride']} more each" if n > windows + 1 else ""),
             "", *table([["i", "id", "token", "logprob"], *rows], numbers=(0, 1, 3)), "",
             f"total log-probability {d['total_logprob']:.4f} nats",
             f"mean per token        {d['mean_logprob']:.4f}", f"perplexity            {perplexity}"]
    return "\n".join(lines)


