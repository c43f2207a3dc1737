"""batching: aggregate tokens/s of B sequences decoded together, against transformers.

B = 1, 2, 4, 8, 16, 32 different 16-token prompts, 32 new tokens each, greedy, never stopping at
end of text: minigpt.generate_batch with the exact and the fast kernels, and transformers' batched
`generate` (left-padded, attention mask, use_cache) on the same weights with the same thread count.
Decode tokens/s = B / the median wall time of a decode step (steps 2 to 32, all B rows together):
what batching changes, and what the targets use. Whole-call tokens/s = B x 32 / wall time of the
call, the prefill of B x 16 prompt tokens included. Every exact row is compared with generating its
prompt alone. In the same rounds, this machine's ceilings for B rows: the per-row gemv ceiling (B x
the multiply-adds of a step at the best rate gemv reaches here, 16 gemvs per block of weights read
from memory, as a step reads them; beside it the bound of blocks already in cache), one gemm per
matrix (`x @ W` for B rows, the model's 49 matrices in sequence), each kernel set's own products
alone, and the exact kernels' attention of a step alone (B sequences at the middle step's positions).
"""

from __future__ import annotations

import statistics
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np

from minigpt.api.api import generate, generate_batch
from minigpt.cli.pictures import plot_lines

from .common import (REPEATS, Report, RunInfo, Target, attention_alone, gemv_rate, interleaved, log, median_of,
                     minigpt_engines, multiply_adds, plain_product, products, random_124m, timed, transformers,
                     transformers_row)

TITLE, DOC, BLOCK = "Batching", "batching.md", "batching"
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
PROMPT_TOKENS, NEW_TOKENS = 16, 32
CONTEXT = PROMPT_TOKENS + NEW_TOKENS // 2  # positions at the middle decode step


def run() -> Report:
    info = RunInfo()
    model, hf = random_124m(), transformers()
    rng = np.random.default_rng(1)
    prompts = rng.integers(model.config.vocab_size, size=(max(BATCH_SIZES), PROMPT_TOKENS)).tolist()
    engines = minigpt_engines()
    for m in engines.values():
        generate_batch(m, prompts[:2], 2, stop_at_eos=False)  # warm-up

    log("batching: each prompt alone ...")
    alone = [generate(model, p, NEW_TOKENS, stop_at_eos=False).tokens for p in prompts]

    log("batching: batches ...")

    def minigpt_batch(m, b):
        results, seconds = timed(lambda: generate_batch(m, prompts[:b], NEW_TOKENS, stop_at_eos=False,
                                                        max_batch_size=b))  # all B rows in every step
        return [r.tokens for r in results], seconds, statistics.median(results[0].step_seconds[1:])

    def hf_batch(b):
        (tokens, steps), seconds = timed(lambda: hf.batch(prompts[:b], NEW_TOKENS))
        return tokens, seconds, statistics.median(steps)

    runs = {}
    for b in BATCH_SIZES:
        for name, m in engines.items():
            runs[name, b] = lambda m=m, b=b: minigpt_batch(m, b)
            runs[f"products {name}", b] = partial(median_of, products(m.kernels.linear, b), 3)
        runs["exact attention", b] = partial(median_of, attention_alone(engines["minigpt exact"], [CONTEXT] * b), 3)
        if hf is not None:
            runs["transformers", b] = lambda b=b: hf_batch(b)
        runs["one gemm", b] = partial(median_of, products(plain_product, b), 3)
    runs["gemv rate", 0] = gemv_rate(from_memory=True)
    runs["gemv rate in cache", 0] = gemv_rate()
    measured = interleaved(runs)
    rounds = {key: results for key, results in measured.items() if isinstance(results[0], tuple)}
    rates, cached_rates = measured.pop(("gemv rate", 0)), measured.pop(("gemv rate in cache", 0))
    rate, cached_rate = max(rates), max(cached_rates)
    # per round, ms: each ceiling, and each engine's median step
    per_round = {key: [s * 1e3 for s in results] for key, results in measured.items() if key not in rounds}
    per_round.update({("gemv", b): [b * multiply_adds(model) / r * 1e3 for r in rates] for b in BATCH_SIZES})
    per_round["gemv in cache", 16] = [16 * multiply_adds(model) / r * 1e3 for r in cached_rates]
    per_round.update({key: [ms * 1e3 for _, _, ms in results] for key, results in rounds.items()})
    ceiling = {key: min(v) for key, v in per_round.items()}

    def over(a: tuple, b: tuple) -> float:
        """a ÷ b, the median of the rounds' ratios (each taken within one round: the machine drifts)."""
        return statistics.median(x / y for x, y in zip(per_round[a], per_round[b]))
    names = [*engines, *(["transformers"] if hf is not None else [])]
    call_tps = {(n, b): b * NEW_TOKENS / min(s for _, s, _ in results) for (n, b), results in rounds.items()}
    step_ms = {(n, b): min(ms for _, _, ms in results) * 1e3 for (n, b), results in rounds.items()}
    tps = {(n, b): b / step_ms[n, b] * 1e3 for n, b in step_ms}  # decode tokens/s
    equal = {(n, b): sum(all(tokens[i] == alone[i] for tokens, _, _ in results) for i in range(b))
             for (n, b), results in rounds.items()}

    for b in BATCH_SIZES:  # the exact kernels' two operations, each timed alone, added round by round
        per_round["exact kernels", b] = [p + a for p, a in zip(per_round["products minigpt exact", b],
                                                               per_round["exact attention", b])]
    targets = batching_targets(tps, over, equal, hf is not None)
    lines = [*info.header(transformers_row(hf)),
             f"### Results (best of {REPEATS} interleaved rounds; random-124m, float32; {PROMPT_TOKENS}-token "
             f"prompts, {NEW_TOKENS} new tokens each, greedy)", "",
             f"Decode tokens/s = B / the median wall time of a decode step (steps 2 to {NEW_TOKENS}, all B rows "
             f"together): what batching changes. Whole-call tokens/s = B × {NEW_TOKENS} / wall time of the call, "
             f"the prefill of B × {PROMPT_TOKENS} prompt tokens included.", "",
             "| B | " + " | ".join(f"{n} decode tokens/s | ÷ B=1" for n in names)
             + (" | exact ÷ transformers" if hf is not None else "")
             + " | whole-call tokens/s (" + " · ".join(n.removeprefix("minigpt ") for n in names)
             + ") | rows equal to exact alone (" + " · ".join(n.removeprefix("minigpt ") for n in names) + ") |",
             "| ---: |" + " ---: | ---: |" * len(names) + " ---: |" * (hf is not None) + " ---: | ---: |"]
    for b in BATCH_SIZES:
        cells = [f"{tps[n, b]:,.1f} | {tps[n, b] / tps[n, 1]:.2f}x" for n in names]
        if hf is not None:
            cells.append(f"{tps['minigpt exact', b] / tps['transformers', b]:.2f}x")
        cells += [" · ".join(f"{call_tps[n, b]:,.0f}" for n in names), " · ".join(f"{equal[n, b]}/{b}" for n in names)]
        lines.append(f"| {b} | " + " | ".join(cells) + " |")
    exact, fast = "minigpt exact", "minigpt fast"
    lines += ["", f"The ceilings for B rows, measured in the same rounds (ms per step, the best round; each ratio is "
              f"the median of the rounds' own ratios; gemv's best rate here: {rate / 1e9:.1f} G multiply-adds/s, "
              f"16 gemvs per block of weights read from memory):", "",
              "| B | exact step | per-row gemv ceiling | ÷ | exact products alone | ÷ | exact attention alone "
              f"({CONTEXT} positions) | exact products and attention alone ÷ per-row gemv ceiling | fast step | "
              "one gemm per matrix | ÷ | fast products alone | ÷ | step ÷ B=1 step (exact · fast) |",
              "| ---: |" + " ---: |" * 13]
    for b in BATCH_SIZES:
        e, f = (exact, b), (fast, b)
        lines.append(f"| {b} | {ceiling[e]:.1f} | {ceiling['gemv', b]:.1f} | {over(e, ('gemv', b)):.2f}x | "
                     f"{ceiling[f'products {exact}', b]:.1f} | {over(e, (f'products {exact}', b)):.2f}x | "
                     f"{ceiling['exact attention', b]:.1f} | {over(('exact kernels', b), ('gemv', b)):.2f}x | "
                     f"{ceiling[f]:.1f} | {ceiling['one gemm', b]:.1f} | {over(f, ('one gemm', b)):.2f}x | "
                     f"{ceiling[f'products {fast}', b]:.1f} | {over(f, (f'products {fast}', b)):.2f}x | "
                     f"{over(e, (exact, 1)):.2f}x · {over(f, (fast, 1)):.2f}x |")
    lines += ["", f"Over a block already in cache gemv reaches {cached_rate / 1e9:.1f} G multiply-adds/s: a bound that "
              f"leaves out the first read of every block from memory, which no decode step can. Against it the exact "
              f"B = 16 step takes {over((exact, 16), ('gemv in cache', 16)):.2f}x, its products alone "
              f"{over(('products ' + exact, 16), ('gemv in cache', 16)):.2f}x."]

    def plot(path: Path) -> None:
        series = {n: (BATCH_SIZES, [tps[n, b] for b in BATCH_SIZES]) for n in names}
        title = ("Decode tokens/s against batch size, GPT-2-small shapes\n"
                 f"(B / median decode step, {PROMPT_TOKENS}-token prompts; scripts/benchmark.py)")
        plot_lines(series, path, title, xlabel="batch size B (different prompts)", ylabel="decode tokens/s (all rows)")

    return Report(info, "\n".join(lines), targets, {"batching.png": plot})


def batching_targets(tps: dict, over: Callable, equal: dict, with_hf: bool) -> list[Target]:
    """What batching is held to: B=16 at this machine's ceilings, no small-batch cliff, its gain over
    transformers, exact rows."""
    exact, fast = "minigpt exact", "minigpt fast"
    rows = []
    ratio = over((exact, 16), ("gemv", 16))
    alone, with_attention = over((f"products {exact}", 16), ("gemv", 16)), over(("exact kernels", 16), ("gemv", 16))
    rows.append(("exact B=16 step <= 1.25x the per-row gemv ceiling",
                 f"{ratio:.2f}x (its products alone {alone:.2f}x, with its attention alone {with_attention:.2f}x)",
                 ratio <= 1.25))
    ratio = over((fast, 16), ("one gemm", 16))
    rows.append(("fast B=16 step <= 1.25x one gemm per matrix", f"{ratio:.2f}x", ratio <= 1.25))
    for name in (exact, fast):
        ratio = over((name, 2), (name, 1))
        rows.append((f"{name}: B=2 step <= 1.5x the B=1 step", f"{ratio:.2f}x", ratio <= 1.5))
    if with_hf:
        ratio = tps[exact, 16] / tps["transformers", 16]
        rows.append(("exact at B=16 >= 1.2x transformers at B=16 (decode tokens/s)", f"{ratio:.2f}x", ratio >= 1.2))
    same = sum(n for (name, _), n in equal.items() if name == exact)
    rows_total = sum(b for (name, b) in equal if name == exact)
    rows.append(("every exact row's tokens equal its prompt generated alone (all rounds)",
                 f"{same}/{rows_total} rows", same == rows_total))
    return rows
