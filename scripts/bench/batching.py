"""batching: aggregate tokens/s of B sequences decoded together, against transformers.

B = 1, 2, 4, 8, 16, 32 different 16-token prompts, 32 new tokens each, greedy, never stopping at
end of text: minigpt.generate_batch with the exact and the fast kernels, and transformers' batched
`generate` (left-padded, attention mask, use_cache) on the same weights with the same thread count.
Decode tokens/s = B / the median wall time of a decode step (steps 2 to 32, all B rows together):
what batching changes, and what the targets use. Whole-call tokens/s = B x 32 / wall time of the
call, the prefill of B x 16 prompt tokens included. Every exact row is compared with generating its
prompt alone.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from minigpt.api import generate, generate_batch
from minigpt.staircase import plot_lines

from .common import (REPEATS, Report, RunInfo, Target, floor_ms, interleaved, log, minigpt_engines,
                     random_124m, timed, transformers, transformers_row)

TITLE, DOC, BLOCK = "Batching", "batching.md", "batching"
BATCH_SIZES = (1, 2, 4, 8, 16, 32)
PROMPT_TOKENS, NEW_TOKENS = 16, 32


def run() -> Report:
    info = RunInfo()
    model, hf = random_124m(), transformers()
    floor = floor_ms()
    rng = np.random.default_rng(1)
    prompts = rng.integers(model.config.vocab_size, size=(max(BATCH_SIZES), PROMPT_TOKENS)).tolist()
    engines = minigpt_engines()
    for m in engines.values():
        generate_batch(m, prompts[:2], 2, stop_at_eos=False)  # warm-up

    log("batching: each prompt alone ...")
    alone = [generate(model, p, NEW_TOKENS, stop_at_eos=False).tokens for p in prompts]

    log("batching: batches ...")

    def minigpt_batch(m, b):
        results, seconds = timed(lambda: generate_batch(m, prompts[:b], NEW_TOKENS, stop_at_eos=False))
        return [r.tokens for r in results], seconds, statistics.median(results[0].step_seconds[1:])

    def hf_batch(b):
        (tokens, steps), seconds = timed(lambda: hf.batch(prompts[:b], NEW_TOKENS))
        return tokens, seconds, statistics.median(steps)

    runs = {}
    for b in BATCH_SIZES:
        for name, m in engines.items():
            runs[name, b] = lambda m=m, b=b: minigpt_batch(m, b)
        if hf is not None:
            runs["transformers", b] = lambda b=b: hf_batch(b)
    rounds = interleaved(runs)
    names = [*engines, *(["transformers"] if hf is not None else [])]
    call_tps = {(n, b): b * NEW_TOKENS / min(s for _, s, _ in results) for (n, b), results in rounds.items()}
    step_ms = {(n, b): min(ms for _, _, ms in results) * 1e3 for (n, b), results in rounds.items()}
    tps = {(n, b): b / step_ms[n, b] * 1e3 for n, b in step_ms}  # decode tokens/s
    equal = {(n, b): sum(all(tokens[i] == alone[i] for tokens, _, _ in results) for i in range(b))
             for (n, b), results in rounds.items()}

    targets = batching_targets(tps, step_ms, equal, floor, hf is not None)
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
    lines.append("")
    lines.append(f"Bandwidth floor {floor:.2f} ms/token (see the decode section in benchmarks.md for how it is "
                 f"measured); exact B=1 decode step {step_ms['minigpt exact', 1]:.2f} ms = "
                 f"{step_ms['minigpt exact', 1] / floor:.2f}x the floor.")

    def plot(path: Path) -> None:
        series = {n: (BATCH_SIZES, [tps[n, b] for b in BATCH_SIZES]) for n in names}
        title = ("Decode tokens/s against batch size, GPT-2-small shapes\n"
                 f"(B / median decode step, {PROMPT_TOKENS}-token prompts; scripts/benchmark.py)")
        plot_lines(series, path, title, xlabel="batch size B (different prompts)", ylabel="decode tokens/s (all rows)")

    return Report(info, "\n".join(lines), targets, {"batching.png": plot})


def batching_targets(tps: dict, step_ms: dict, equal: dict, floor: float, with_hf: bool) -> list[Target]:
    """What batching is held to: its gains over one row and over transformers, one-row decode
    against the floor, exact rows."""
    exact, fast = "minigpt exact", "minigpt fast"
    rows = []
    ratio = tps[exact, 16] / tps[exact, 1]
    rows.append(("exact at B=16 >= 3.5x exact at B=1 (decode tokens/s)", f"{ratio:.2f}x", ratio >= 3.5))
    if with_hf:
        ratio = tps[exact, 16] / tps["transformers", 16]
        rows.append(("exact at B=16 >= 1.2x transformers at B=16 (decode tokens/s)", f"{ratio:.2f}x", ratio >= 1.2))
    ratio = tps[fast, 16] / tps[fast, 1]
    rows.append(("fast at B=16 >= 5x fast at B=1 (decode tokens/s)", f"{ratio:.2f}x", ratio >= 5))
    ratio = step_ms[exact, 1] / floor
    rows.append(("exact B=1 decode step <= 1.15x the bandwidth floor", f"{ratio:.2f}x", ratio <= 1.15))
    same = sum(n for (name, _), n in equal.items() if name == exact)
    rows_total = sum(b for (name, b) in equal if name == exact)
    rows.append(("every exact row's tokens equal its prompt generated alone (all rounds)",
                 f"{same}/{rows_total} rows", same == rows_total))
    return rows
