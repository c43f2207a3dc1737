"""`prove`: run the causal-mask proof (minigpt.causal_proof) and print its table, or JSON."""

from __future__ import annotations

import argparse
import dataclasses

from ..causal_proof import COLUMNS, Drift, Proof, prove
from .common import add_model_options, checked, encode_prompt, load_model, print_json

DEFAULT_PROMPT = "The causal mask means that no position can see the future, so"  # 13 GPT-2 tokens
LABELS = {"unchanged": "old positions unchanged", "masked": "masked weights = +0.0",
          "causal": "unseen tokens changed", "cached": "cached loop = naive loop"}
MARK = {True: "yes", False: "NO", None: "-"}


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
        print(report(proof, args))
    return 0 if proof.holds else 1


def as_json(proof: Proof, args: argparse.Namespace) -> dict:
    return {"model": args.model, "prompt": args.prompt, **dataclasses.asdict(proof), "holds": proof.holds}


def report(proof: Proof, args: argparse.Namespace) -> str:
    """The verdict table, the work counted, each kernel set's drift and the result."""
    widths = (8, 8, 8, 8, 9, 9)
    lines = [
        f"model {args.model}",
        f"kernels {proof.kernels}: a {proof.prompt_len}-token prompt, {proof.steps} greedy steps, "
        "naive loop against KV-cache loop",
        "",
        f"{'':12}{'old positions unchanged':<24}{'masked':<8}{'unseen':<9}{'cached':<9}{'largest':>8}",
        f"{'layer':<12}{'hidden':<8}{'K':<8}{'V':<8}{'= +0.0':<8}{'changed':<9}{'= naive':<9}{'diff':>8}",
    ]
    for row in proof.rows:
        cells = "".join(f"{MARK[row.verdicts[c]]:<{w}}" for c, w in zip(COLUMNS, widths))
        lines.append(f"{row.layer:<12}{cells}{row.scale_ulp:>8.3g}")
    w, P, N = proof.work, proof.prompt_len, proof.steps
    lines += [
        "(largest diff: in ULPs at the layer's scale, the float32 spacing at its largest value; 0: bit for bit)",
        "",
        f"tokens: cached loop == naive loop at every step: {MARK[proof.drifts[0].tokens_equal]}",
        f"work: naive loop {w.naive} tokens through the model (P*N + N(N-1)/2 = {P}*{N} + {N * (N - 1) // 2}), "
        f"cached loop {w.cached} (P + N - 1);",
        f"      {w.naive - w.cached} of the naive loop's {w.naive} ({w.repeated_share:.1%}) were positions "
        "it had already computed",
        *(describe(d) for d in proof.drifts),
        "result: " + ("HOLDS: every check passed bit for bit" if proof.holds else
                      f"FAILS with the {proof.kernels} kernels (see the NO cells and the drift)"),
    ]
    return "\n".join(lines)


def describe(drift: Drift) -> str:
    """Where each check's first bits changed, and the largest change."""
    head = f"drift, {drift.kernels} kernels:"
    if not any(drift.first.values()):
        return f"{head} none; every compared bit is identical"
    lines = [f"{head} where each check first saw bits change"]
    for check, c in drift.first.items():
        where = "nowhere" if c is None else (
            f"step {c.step}, {c.layer if c.quantity in ('hidden', 'logits') else f'{c.layer} {c.quantity}'}, "
            f"position {c.position}")
        lines.append(f"  {LABELS[check]:<26}{where}")
    lines += [f"  largest difference {drift.scale_ulp:.3g} ULP at the layer's scale ({drift.max_abs:.3g} absolute; "
              f"{drift.max_ulp} ULP between raw",
              "  bit patterns, which count the tiny ULPs near 0.0); tokens "
              + ("the same" if drift.tokens_equal else "DIFFERENT")]
    return "\n".join(lines)
