"""`prove`: run the causal-mask proof (minigpt.causal_proof) and print its table, or JSON."""

from __future__ import annotations

import argparse
import dataclasses

from ..causal_proof import Proof, prove
from .common import add_model_options, checked, encode_prompt, load_model, print_json

DEFAULT_PROMPT = "The causal mask means that no position can see the future, so"  # 13 GPT-2 tokens


def add_parser(sub) -> None:
    p = sub.add_parser(
        "prove", help="check bit for bit that the KV cache is exact",
        description="Run the naive and the KV-cache generation loops side by side and check, bit for bit, "
                    "that old positions never change, masked attention weights are exactly 0.0, future "
                    "tokens do not reach earlier positions, and the cached loop computes exactly the naive "
                    "loop's numbers; count the work the cache saves; and show how far the fast (plain BLAS) "
                    "kernels drift. See docs/exactness.md.",
        epilog="Exit status: 0 when every check holds bit for bit with the kernels checked, 1 when any fails "
               "(or on an error). With --kernels exact (the default) 1 means a bug. With --kernels fast, 1 is "
               "the expected, honest outcome: those kernels are not batch-invariant, and the report shows "
               "where their bits drift; 0 would mean this run happened to see no drift.",
    )
    add_model_options(p, default="random-124m")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help=f"the prompt text (default: {DEFAULT_PROMPT!r})")
    p.add_argument("--steps", type=checked(int, lambda v: v >= 2, ">= 2 (the proof compares consecutive steps)"),
                   default=8, help="new tokens to generate, at least 2 (default 8)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON document")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    model = load_model(args)
    proof = prove(model, encode_prompt(model, args.prompt), args.steps)
    if args.json:
        print_json(as_json(proof, args))
    else:
        print(f"model {args.model}\n{proof}")
    return 0 if proof.holds else 1


def as_json(proof: Proof, args: argparse.Namespace) -> dict:
    return {"model": args.model, "prompt": args.prompt, **dataclasses.asdict(proof), "holds": proof.holds}
