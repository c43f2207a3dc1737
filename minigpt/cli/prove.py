"""`prove`: run the causal-mask proof (minigpt.exact.causal_proof) and print its table, or JSON."""

from __future__ import annotations

import argparse
import dataclasses

from ..api.api import prove
from ..exact.causal_proof import COLUMNS, Comparison, Drift, Proof
from . import pictures
from .flags import add_model_options, bounded, encode_prompt, load_model
from .output import print_json, print_whole, table
from .staircase import check_plot_target, plot_path

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
    p.add_argument("--steps", type=bounded(int, lambda v: v >= 2, ">= 2 (the proof compares consecutive steps)"),
                   default=8, help="new tokens to generate, at least 2 (default 8)")
    p.add_argument("--json", action="store_true", help="print the results as one JSON document")
    p.add_argument("--plot", type=plot_path, metavar="PATH",
                   help="also draw the proof at a glance to PATH (matplotlib): per layer and step, the largest "
                        "difference between the cached and the naive forward, for each kernel set")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.plot is not None:
        check_plot_target(args.plot)
    model = load_model(args)
    proof = prove(model, encode_prompt(model, args.prompt), args.steps)
    if args.plot is not None:
        pictures.proof(proof, args.plot, f"{args.model}: cached vs naive, {proof.prompt_len}-token prompt, "
                                         f"{proof.steps} steps")
    if args.json:
        print_json(as_json(proof, args))
    else:
        print_whole(f"model {args.model}\n{render(proof)}")
    return 0 if proof.holds else 1


def as_json(proof: Proof, args: argparse.Namespace) -> dict:
    return {"model": args.model, "prompt": args.prompt, **dataclasses.asdict(proof), "holds": proof.holds}


LABELS = {"unchanged": "old positions unchanged", "masked": "masked weights = +0.0",
          "causal": "unseen tokens changed", "cached": "cached loop = naive loop"}
MARK = {True: "yes", False: "NO", None: "-"}


def render(proof: Proof) -> str:
    """The verdict table, the work counted, each kernel set's drift and the result."""
    header = [["", "old", "old", "old", "masked", "unseen", "cached", "largest"],
              ["layer", "hidden", "K", "V", "= +0.0", "changed", "= naive", "diff"]]
    rows = [[row.layer, *(MARK[row.verdicts[c]] for c in COLUMNS), f"{row.scale_ulp:.3g}"] for row in proof.rows]
    w, P, N = proof.work, proof.prompt_len, proof.steps
    lines = [
        f"kernels {proof.kernels}: a {P}-token prompt, {N} greedy steps, naive loop against KV-cache loop", "",
        *table(header + rows, numbers=(1 + len(COLUMNS),)),  # layer, a verdict per check, then the largest diff
        "(old: the positions of the step before, unchanged; largest diff: in ULPs at the layer's scale,",
        " the float32 spacing at its largest value; 0: bit for bit)", "",
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
    where = [[f"  {LABELS[check]}", location(c)] for check, c in drift.first.items()]
    return "\n".join([
        f"{head} where each check first saw bits change", *table(where),
        f"  largest difference {drift.scale_ulp:.3g} ULP at the layer's scale ({drift.max_abs:.3g} absolute; "
        f"{drift.max_ulp} ULP between raw",
        "  bit patterns, which count the tiny ULPs near 0.0); tokens "
        + ("the same" if drift.tokens_equal else "DIFFERENT")])


def location(c: Comparison | None) -> str:
    """Where a check first saw bits change: "step 1, block 0 K, position 13", or "nowhere"."""
    if c is None:
        return "nowhere"
    what = c.layer if c.quantity in ("hidden", "logits") else f"{c.layer} {c.quantity}"
    return f"step {c.step}, {what}, position {c.position}"
