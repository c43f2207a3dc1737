"""`generate "PROMPT"`: stream a continuation as it is produced, or print it as JSON."""

from __future__ import annotations

import argparse
import sys

from ..api import generate, stream
from ..loading import load
from ..sequence import GenerationResult
from ..tokenizer import token_text, valid_text
from .common import add_model_options, add_sampling_options, encode_prompt, load_model, positive_int, print_json


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="continue a prompt",
                       description="Continue PROMPT with GPT-2, streaming the text as it is produced. "
                                   "An empty prompt starts from <|endoftext|>; a literal '<|endoftext|>' "
                                   "in the prompt is that special token, as in Hugging Face's tokenizer.")
    p.add_argument("prompt", help="the text to continue")
    add_model_options(p)
    add_sampling_options(p)
    loop = p.add_mutually_exclusive_group()
    loop.add_argument("--no-cache", action="store_true", help="the naive loop: rerun the whole sequence every step")
    loop.add_argument("--speculate", metavar="ngram|SRC",
                      help="speculative decoding: guess tokens by prompt lookup (ngram) or with a draft model "
                           "(SRC, loaded with the same --kernels) and check them in one forward; same tokens")
    p.add_argument("--draft-tokens", type=positive_int, default=4, metavar="K",
                   help="with --speculate: at most K guesses per step (default 4)")
    p.add_argument("--truncate-prompt", action="store_true",
                   help="if prompt + new tokens - 1 (the last is never fed) exceed the context, keep only the "
                        "prompt's last tokens")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of streaming text")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    model = load_model(args)
    tokenizer = model.tokenizer
    ids = encode_prompt(model, args.prompt)  # undecodable bytes in the argument are kept as byte tokens
    speculate = None
    if args.speculate is not None:
        speculate = "ngram" if args.speculate == "ngram" else load(args.speculate, kernels=args.kernels)
    options = dict(use_cache=not args.no_cache, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed, stop_at_eos=not args.no_stop, stop=args.stop,
                   top_logprobs=args.top_logprobs, truncate_prompt=args.truncate_prompt,
                   speculate=speculate, draft_tokens=args.draft_tokens)
    if args.json:
        print_json(as_json(generate(model, ids, args.max_new_tokens, **options), tokenizer, args))
        return 0
    tokens = stream(model, ids, args.max_new_tokens, **options)  # checks everything before printing
    sys.stdout.write(valid_text(args.prompt))
    sys.stdout.flush()
    for token in tokens:  # each with the text it adds, once no stop string can take it back
        sys.stdout.write(token.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def as_json(result: GenerationResult, tokenizer, args: argparse.Namespace) -> dict:
    """The run as one JSON document: every option that shaped it, then what it produced."""
    document = {
        "model": args.model, "kernels": args.kernels, "use_cache": result.use_cache,
        "temperature": args.temperature, "top_k": args.top_k, "top_p": args.top_p, "seed": args.seed,
        "max_new_tokens": args.max_new_tokens, "stop": args.stop or [], "stop_at_eos": not args.no_stop,
        "truncate_prompt": args.truncate_prompt, "speculate": args.speculate,
    }
    if args.speculate is not None:
        document.update(draft_tokens=args.draft_tokens, drafted=result.drafted, accepted=result.accepted)
    document.update({
        "finish_reason": result.finish_reason,
        "prompt": valid_text(args.prompt),  # undecodable bytes replaced; prompt_ids hold them
        "prompt_ids": result.prompt_ids, "tokens": result.tokens,
        "text": result.text,  # before a stop string, without the <|endoftext|> that ended it
        "logprobs": result.logprobs,
    })
    if result.top_logprobs is not None:
        document["top_logprobs"] = [[{"id": t, "token": token_text(tokenizer, t), "logprob": lp} for t, lp in step]
                                    for step in result.top_logprobs]
    document["step_ms"] = [round(s * 1e3, 3) for s in result.step_seconds]
    return document
