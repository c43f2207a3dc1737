"""`cost --prompt P --reply N`: the naive loop's work against the KV cache's, by arithmetic (instant)."""

from __future__ import annotations

import argparse

from ..loop.cost import ARCHITECTURES, DTYPE_BYTES, MAX_TOKENS, Cost, estimate
from .common import binary, checked, print_json, print_whole, table

token_count = checked(int, lambda v: 1 <= v <= MAX_TOKENS, "in 1..10**15")  # cost.estimate's bound


def add_parser(sub) -> None:
    p = sub.add_parser("cost", help="tokens, FLOPs and KV-cache bytes of a request, naive vs cached",
                       description="Pure arithmetic, nothing is run: tokens pushed through the model by the "
                                   "naive loop (P*N + N*(N-1)/2) and by the KV-cache loop (P + N - 1: the last "
                                   "new token is returned, never fed back), their approximate FLOPs, and the KV "
                                   "cache's size. See docs/staircase.md.")
    p.add_argument("--prompt", type=token_count, required=True, metavar="P", help="prompt length in tokens")
    p.add_argument("--reply", type=token_count, required=True, metavar="N", help="new tokens generated")
    p.add_argument("--model", choices=list(ARCHITECTURES), default="gpt2", help="architecture (default: gpt2)")
    p.add_argument("--dtype", choices=list(DTYPE_BYTES), default=None,
                   help="KV-cache and weight dtype (default: float32 for GPT-2 as minigpt runs it, "
                        "bfloat16 for llama-3-8b)")
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    c = estimate(ARCHITECTURES[args.model], args.prompt, args.reply, args.dtype)
    if args.json:
        print_json(as_json(c))
    else:
        print_whole(report(c))
    return 0


def as_json(c: Cost) -> dict:
    return {"model": c.arch.name, "prompt": c.prompt, "reply": c.reply, "dtype": c.dtype,
            "naive_tokens": c.naive_tokens, "cached_tokens": c.cached_tokens, "ratio": c.ratio,
            "naive_flops": c.naive_flops, "cached_flops": c.cached_flops, "flop_ratio": c.flop_ratio,
            "kv_bytes_per_token": c.kv_bytes_per_token, "kv_bytes_total": c.kv_bytes_total,
            "weight_bytes_per_token": c.weight_bytes_per_token, "fits_context": c.fits_context}


def report(c: Cost) -> str:
    lines = [f"{c.arch.name}: {c.prompt:,}-token prompt + {c.reply:,}-token reply, {c.dtype}", "",
             *table([["", "naive loop", "KV cache", "ratio"],
                     ["tokens through model", f"{c.naive_tokens:,}", f"{c.cached_tokens:,}", times(c.ratio)],
                     ["FLOPs (approx.)", si(c.naive_flops), si(c.cached_flops), times(c.flop_ratio)]],
                   numbers=(1, 2, 3)),
             "(naive: step n feeds all P + n tokens, P*N + N(N-1)/2; KV cache: the prompt once, then every",
             " new token but the last, which is returned, never fed back: P + N - 1. Lesson 03-01 counts",
             f" P + N = {c.prompt + c.reply:,}, for a loop that also feeds its last token.)", "",
             f"KV cache: {c.kv_bytes_per_token:,} bytes per token ({binary(c.kv_bytes_per_token)}); "
             f"P + N - 1 = {c.cached_tokens:,} cached: {c.kv_bytes_total:,} bytes ({binary(c.kv_bytes_total)})",
             f"weights read per cached decode step: {c.weight_bytes_per_token:,} bytes "
             f"({binary(c.weight_bytes_per_token)})"]
    if not c.fits_context:
        lines.append(f"note: P + N - 1 = {c.cached_tokens:,} positions exceed {c.arch.name}'s context of "
                     f"{c.arch.n_positions:,}; the figures are arithmetic only")
    return "\n".join(lines)


def times(ratio: float) -> str:
    """A ratio to about three significant figures: 0.5x, 1.71x, 30.2x, 213x, 1,179x."""
    return f"{ratio:,.0f}x" if ratio >= 100 else f"{ratio:.3g}x"


def si(n: float) -> str:
    """1.23 GFLOP-style: a count with an SI prefix."""
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {prefix}"
    return f"{n:g}"

