"""`generate "PROMPT"`: stream a continuation as it is produced, or print it as JSON."""

from __future__ import annotations

import argparse
import codecs
import sys

from ..generate import generate, stream
from .common import (add_model_options, encode_prompt, load_model, non_negative_float, non_negative_int,
                     positive_int, print_json, probability)


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="continue a prompt",
                       description="Continue PROMPT with GPT-2, streaming the text as it is produced. "
                                   "An empty prompt starts from <|endoftext|>; a literal '<|endoftext|>' "
                                   "in the prompt is encoded as ordinary text.")
    p.add_argument("prompt", help="the text to continue")
    add_model_options(p)
    p.add_argument("--max-new-tokens", type=non_negative_int, default=40,
                   help="at most this many new tokens (default 40)")
    p.add_argument("--temperature", type=non_negative_float, default=0.0,
                   help="0 is greedy (default); higher samples more freely")
    p.add_argument("--top-k", type=positive_int, default=None, help="sample among the k most likely tokens")
    p.add_argument("--top-p", type=probability, default=None,
                   help="sample among the smallest set holding this probability")
    p.add_argument("--seed", type=non_negative_int, default=None, help="a seed makes sampling reproducible")
    p.add_argument("--no-cache", action="store_true", help="the naive loop: rerun the whole sequence every step")
    p.add_argument("--no-stop", action="store_true", help="keep going past <|endoftext|>")
    p.add_argument("--truncate-prompt", action="store_true",
                   help="if prompt + new tokens exceed the context, keep only the prompt's last tokens")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of streaming text")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    model = load_model(args)
    tokenizer = model.tokenizer
    ids = encode_prompt(model, args.prompt)
    options = dict(use_cache=not args.no_cache, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed, stop_at_eos=not args.no_stop,
                   truncate_prompt=args.truncate_prompt)
    if args.json:
        result = generate(model, ids, args.max_new_tokens, **options)
        print_json({"model": args.model, "kernels": args.kernels, "use_cache": result.use_cache,
                    "prompt": args.prompt, "prompt_ids": result.prompt_ids, "tokens": result.tokens,
                    "text": tokenizer.decode(result.tokens),
                    "step_ms": [round(s * 1e3, 3) for s in result.step_seconds]})
        return 0
    tokens = stream(model, ids, args.max_new_tokens, **options)  # checks everything before printing
    text = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character may span tokens
    sys.stdout.write(args.prompt)
    sys.stdout.flush()
    for token in tokens:
        sys.stdout.write(text.decode(tokenizer.decode_single_token_bytes(token.token)))
        sys.stdout.flush()
    sys.stdout.write(text.decode(b"", final=True) + "\n")
    return 0
