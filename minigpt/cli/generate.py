"""`generate "PROMPT"`: stream a continuation as it is produced, or print it as JSON."""

from __future__ import annotations

import argparse
import sys

from ..api.api import generate_request, stream_request
from ..requests.request import OPTIONS, make_request
from ..errors import MinigptError
from ..loading.loader import load
from ..loading.model import Model
from ..loop.sequence import GenerationResult
from ..engine.drafters import DRAFT_TOKENS
from ..loading.tokenizer import valid_text
from .flags import (UsageError, add_model_options, add_request_options, encode_prompt, load_model, positive_int,
                    request_options)
from .output import print_json, print_whole, top_logprobs_json


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="continue a prompt",
                       description="Continue PROMPT with GPT-2, streaming the text as it is produced. "
                                   "An empty prompt starts from <|endoftext|>; a literal '<|endoftext|>' "
                                   "in the prompt is that special token, as in Hugging Face's tokenizer.")
    p.add_argument("prompt", help="the text to continue")
    add_model_options(p)
    add_request_options(p, batched=False)
    loop = p.add_mutually_exclusive_group()
    loop.add_argument("--no-cache", action="store_true", help="the naive loop: rerun the whole sequence every step")
    loop.add_argument("--speculate", metavar="ngram|SRC",
                      help="speculative decoding: guess tokens by prompt lookup (ngram) or with a draft model "
                           "(SRC, loaded with the same --kernels) and check them in one forward. Greedy, exact "
                           "kernels: the very tokens plain decoding gives (fast kernels: a near-tie may break the "
                           "other way); sampling: tokens from the same distribution, though a --seed gives others")
    p.add_argument("--draft-tokens", type=positive_int, default=None, metavar="K",
                   help=f"with --speculate: at most K guesses per step (default {DRAFT_TOKENS})")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of streaming text")
    p.set_defaults(run=run)


def check_needed(args: argparse.Namespace) -> None:
    """An option that has no effect without another is a usage error saying so, never ignored."""
    greedy = "greedy decoding takes the most likely token"
    needs = [("--top-logprobs", args.top_logprobs, args.json, "--json", "only the JSON output has log-probabilities"),
             ("--draft-tokens", args.draft_tokens, args.speculate, "--speculate", "nothing drafts without it"),
             ("--top-k", args.top_k, args.temperature, "--temperature above 0", greedy),
             ("--top-p", args.top_p, args.temperature, "--temperature above 0", greedy),
             ("--seed", args.seed, args.temperature, "--temperature above 0", greedy)]
    for option, value, other, name, why in needs:
        if value is not None and not other:
            raise UsageError(f"argument {option}: has no effect without {name} ({why})")


def run(args: argparse.Namespace) -> int:
    values, _ = request_options(args)  # checked once, now, before the model is loaded
    check_needed(args)
    model = load_model(args)
    tokenizer = model.tokenizer
    ids = encode_prompt(model, args.prompt)  # undecodable bytes in the argument are kept as byte tokens
    request = make_request(model, ids, values, True)  # against the model and the prompt; --truncate-prompt offered
    speculate = None
    if args.speculate is not None:
        speculate = "ngram" if args.speculate == "ngram" else load_draft(args)
    loop = {"use_cache": not args.no_cache, "speculate": speculate, "draft_tokens": args.draft_tokens}
    if args.json:
        print_json(as_json(generate_request(model, request, **loop), tokenizer, args, values))
        return 0
    tokens = stream_request(model, request, **loop)  # checks the loop's keywords before printing
    sys.stdout.write_whole(valid_text(args.prompt))  # each piece to its last byte (Stream.write_whole)
    for token in tokens:  # each with the text it adds, once no stop string can take it back
        sys.stdout.write_whole(token.text)
    print_whole("")
    return 0


def json_value(value: object) -> object:
    """An option's checked value as JSON has it: a tuple as a list, logit_bias's ids as the keys' strings."""
    if isinstance(value, dict):
        return {str(key): item for key, item in value.items()}
    return list(value) if isinstance(value, tuple) else value


def load_draft(args: argparse.Namespace) -> Model:
    """The draft model --speculate names; its errors say so, as the model's name no option."""
    try:
        return load(args.speculate, kernels=args.kernels)
    except MinigptError as e:
        raise type(e)(f"--speculate: {e}") from None


def as_json(result: GenerationResult, tokenizer, args: argparse.Namespace, values: dict) -> dict:
    """The run as one JSON document: every option that shaped it (each request option's checked
    value, given or at its default; top_logprobs's are the lists themselves), then what it produced."""
    document = {"model": args.model, "kernels": args.kernels, "use_cache": result.use_cache,
                **{name: json_value(values[name]) for name in OPTIONS if name != "top_logprobs"},
                "speculate": args.speculate}
    if args.speculate is not None:
        document.update(draft_tokens=args.draft_tokens or DRAFT_TOKENS, drafted=result.drafted,
                        accepted=result.accepted)
    document.update({
        "finish_reason": result.finish_reason,
        "prompt": valid_text(args.prompt),  # undecodable bytes replaced; prompt_ids hold them
        "prompt_ids": result.prompt_ids, "tokens": result.tokens,
        "text": result.text,  # before a stop string, without the <|endoftext|> that ended it
        "logprobs": result.logprobs,
    })
    if result.top_logprobs is not None:
        document["top_logprobs"] = top_logprobs_json(tokenizer, result.top_logprobs)
    document["step_ms"] = [round(s * 1e3, 3) for s in result.step_seconds]
    return document
