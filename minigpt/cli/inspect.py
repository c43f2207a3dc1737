"""`inspect TEXT`: look inside one forward (minigpt.api.inspection): the logit lens as a table, or
as JSON, and with --plot pictures of attention and of the lens."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ..errors import InputError
from ..exact.tracing import layer_names
from ..loading.tokenizer import token_text
from ..api.api import INSPECT_TOKENS, inspect
from .flags import UsageError, add_model_options, bounded, encode_prompt, load_model
from .output import print_json, print_whole, table
from . import pictures
from .staircase import check_plot_target


def add_parser(sub) -> None:
    p = sub.add_parser(
        "inspect", help="look inside one forward: attention and the logit lens",
        description="Run one forward over TEXT and show what it computed: the logit lens (the next token the "
                    "model would predict at each position if it stopped after each layer), and with --plot "
                    "pictures of attention (every layer and head, or one) and of the lens. See docs/model.md.")
    p.add_argument("text", help="the text to run the model over (GPT-2's tokenizer)")
    add_model_options(p, default="gpt2")
    p.add_argument("--layer", type=bounded(int, lambda v: v >= 0, ">= 0"), help="draw this layer's heads only")
    p.add_argument("--head", type=bounded(int, lambda v: v >= 0, ">= 0"), help="draw this head only (of --layer, "
                   "or of every layer)")
    p.add_argument("--top", type=bounded(int, lambda v: 1 <= v <= 20, "in 1..20"), default=5,
                   help="tokens per cell of the logit lens in --json (default 5)")
    p.add_argument("--plot", type=Path, metavar="DIR", help="write attention.png and logit-lens.png into DIR "
                   "(matplotlib: the plot extra)")
    p.add_argument("--json", action="store_true", help="print the tokens and the logit lens as one JSON document")
    p.add_argument("--attention", action="store_true", help="with --json: also the attention weights (of --layer "
                   f"and --head when given; at most {MAX_PRINTED_WEIGHTS:,})")
    p.set_defaults(run=run)


MAX_PRINTED_WEIGHTS = 1 << 22  # attention weights --json --attention prints at most (about 80 MB of JSON)


def run(args: argparse.Namespace) -> int:
    if args.attention and not args.json:
        raise UsageError("argument --attention: only with --json (the weights are large)")
    name = "attention.png" if args.layer is None and args.head is None else (
        "attention" + (f"-layer{args.layer}" if args.layer is not None else "")
        + (f"-head{args.head}" if args.head is not None else "") + ".png")
    if args.plot is not None:  # every precondition of the pictures before the model and its forward
        if not os.path.isdir(args.plot):
            raise UsageError(f"argument --plot: {str(args.plot)!r} is not a directory")
        for file in (name, "logit-lens.png"):
            check_plot_target(args.plot / file)
    model = load_model(args)
    ids = encode_prompt(model, args.text)
    config = model.config
    for option, value, limit in (("--layer", args.layer, config.n_layer), ("--head", args.head, config.n_head)):
        if value is not None and value >= limit:
            raise InputError(f"{option} {value}: this model has {limit} (0 .. {limit - 1})")
    if len(ids) > INSPECT_TOKENS:
        raise UsageError(f"argument text: {len(ids):,} tokens; inspect looks inside at most {INSPECT_TOKENS:,}")
    layers = [args.layer] if args.layer is not None else list(range(config.n_layer))
    heads = [args.head] if args.head is not None else list(range(config.n_head))
    weights = len(layers) * len(heads) * len(ids) ** 2
    if args.attention and weights > MAX_PRINTED_WEIGHTS:
        raise UsageError(f"argument --attention: {len(layers)} layers x {len(heads)} heads x {len(ids)}^2 positions "
                         f"are {weights:,} weights, beyond the {MAX_PRINTED_WEIGHTS:,} printed at most: choose a "
                         "layer (--layer) or a head (--head), or a shorter text")
    drawn = args.plot is not None or args.attention
    found = inspect(model, ids, layers if drawn else [], heads)
    tokens = [token_text(model.tokenizer, i) for i in ids]
    lens_ids, lens_probs = found.logit_lens(args.top)
    if args.plot is not None:
        pictures.attention(found.attention, tokens, args.plot / name, f"{args.model}: attention, {len(ids)} tokens",
                           layers, heads)
        pictures.logit_lens(lens_ids, lens_probs, tokens, lambda i: token_text(model.tokenizer, i),
                            args.plot / "logit-lens.png", f"{args.model}: the logit lens")
    if args.json:
        document = {"model": args.model, "ids": ids, "tokens": tokens, "layers": layer_names(config.n_layer)[:-1],
            "logit_lens": [[[{"id": int(i), "token": token_text(model.tokenizer, int(i)), "prob": float(p)}
                             for i, p in zip(lens_ids[layer, t], lens_probs[layer, t])]
                            for t in range(len(ids))] for layer in range(config.n_layer + 1)]}
        if args.attention:  # [layers][heads][T][T], of the layers and heads asked for
            document.update(attention=found.attention.tolist(), attention_layers=layers, attention_heads=heads)
        print_json(document)
    elif args.plot is None:
        print_whole(render(tokens, lens_ids, lens_probs, model))
    return 0


def render(tokens: list[str], ids, probs, model) -> str:
    """The logit lens as text: a row per layer (the model's own prediction last), a column per position."""
    names = layer_names(len(ids) - 1)[:-1]
    rows = [["", *(repr(t) for t in tokens)]]
    for layer, name in enumerate(names):
        rows.append([name, *(f"{token_text(model.tokenizer, int(ids[layer, t, 0]))!r} {probs[layer, t, 0]:.2f}"
                             for t in range(len(tokens)))])
    return "\n".join(["the logit lens: at each position (column), the most likely next token if the model stopped "
                      "after each layer (row)", *table(rows)])
