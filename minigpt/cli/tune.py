"""`tune`: measure how the exact kernels should cut the weights on this machine, and keep the choice."""

from __future__ import annotations

import argparse
from dataclasses import asdict

from ..gpt2.config import GPT2_SIZES
from ..errors import MinigptError
from ..exact.tuner import measure
from ..exact.tuning import key, keep, machine_default
from .output import print_json, table


def add_parser(sub) -> None:
    p = sub.add_parser("tune", help="measure the exact kernels' block sizes for this machine and keep them",
                       description="Times the exact kernels' matrix products on a GPT-2 size's matrices at "
                                   "several block sizes and row-count switches (about twenty seconds), and keeps the "
                                   "fastest for this CPU, BLAS build and thread count in the user's cache "
                                   "directory; every later run uses it (MINIGPT_TUNING=off ignores it). The "
                                   "choice changes no bit of any result, only the speed.")
    p.add_argument("--model", choices=list(GPT2_SIZES), default="gpt2",
                   help="the GPT-2 size whose shapes are measured (default: gpt2)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    config = GPT2_SIZES[args.model]
    choice, report = measure(config.n_embd, config.vocab_size)
    try:
        path = keep(choice)
    except OSError as e:
        raise MinigptError(f"cannot keep the tuning in {e.filename}: {e.strerror}") from None
    if args.json:
        print_json({"machine": key(), "default": asdict(machine_default()), "choice": asdict(choice),
                    "kept_in": str(path), "seconds": report})
        return 0
    print(f"machine: {key()}")
    for decision, seconds in report.items():
        print("\n".join(table([[decision, "best ms"], *[[c, f"{s * 1e3:.2f}"] for c, s in seconds.items()]],
                               numbers=(1,))))
    print(f"choice: {asdict(choice)} (the caches' default: {asdict(machine_default())})\nkept in {path}")
    return 0
