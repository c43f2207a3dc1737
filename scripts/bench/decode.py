"""decode: one sequence, minigpt (exact and fast kernels) against transformers and the products alone.

- cached decode ms/token: the same prompt and number of tokens, greedy, the same thread count; the
  two kernel sets in lockstep, one step of each in turn;
- each kernel set's own products alone: the 49 one-row matrix products of a step, timed in
  sequence right after each of its steps; the floor is the fastest of them (the read bandwidth as
  decode reads);
- the rest of a step: within each step (the step less its products, timed as they run; two
  timer reads per product and per attention call), and hot, alone: a step whose products are
  answered from a table; of each, the attention;
- prefill tokens/s (512 tokens), exact vs fast (and transformers), and each kernel set's products
  and attention of that prefill, each timed alone in the same rounds: how much of a prefill the
  two operations a kernel set decides take;
- flatness: median of the last 16 / first 16 cached steps after a 512-token prompt;
- the naive loop's time for token 1 and token 40 from a one-token prompt.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from functools import partial
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np

from minigpt.api.api import generate
from minigpt.requests.request import make_requests
from minigpt.loop.loops import cached_steps
from minigpt.loop.sequence import Sequence
from minigpt.cache.kv_cache import forward_cached, new_cache
from minigpt.loading.model import Model
from minigpt.engine.paging import PAGE, pages_for
from minigpt.cli.pictures import plot_latencies
from minigpt.loop.staircase import fixed_prompt

from .common import (REPEATS, Report, RunInfo, Target, Transformers, attention_alone, interleaved, log, median_of,
                     minigpt_engines, plain_product, products, random_124m, read_note, transformers, transformers_row)

TITLE, DOC, BLOCK = "Decode, prefill and the naive loop", "benchmarks.md", ""
DECODE_PROMPT, DECODE_TOKENS = 16, 64  # short context: the weights dominate, as in the floor
FLAT_PROMPT, FLAT_TOKENS, FLAT_WINDOW = 512, 129, 16
PREFILL = 512
NAIVE_TOKENS = 40


def minigpt_cached(model: Model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """The greedy tokens and the seconds of each cached step after the first (which includes the prefill)."""
    result = generate(model, prompt, n, stop_at_eos=False)
    return result.tokens, result.step_seconds[1:]


def clocked(model: Model) -> tuple[Model, dict[str, float]]:
    """`model` with its kernels' two operations timed as a forward calls them, and the seconds they
    take, accumulated (set them to 0 before a step): the split of a step as it runs, caches and all."""
    spent = {"products": 0.0, "attention": 0.0}

    def timed(part: str, operation: Callable) -> Callable:
        def run(*args, **kwargs):
            start = time.perf_counter()
            try:
                return operation(*args, **kwargs)
            finally:
                spent[part] += time.perf_counter() - start
        return run
    k = model.kernels
    kernels = dataclasses.replace(k, linear=timed("products", k.linear), attend=timed("attention", k.attend),
                                  attend_batch=timed("attention", k.attend_batch))
    return dataclasses.replace(model, kernels=kernels), spent


class Steps(NamedTuple):
    """One engine's lockstep decode: its tokens, and per step after the first, the seconds of the
    step, of its products and of its attention within it, and of its products alone right after it."""

    tokens: list[int]
    seconds: list[float]
    products: list[float]
    attention: list[float]
    alone: list[float]


def lockstep(engines: dict[str, Model], prompt: list[int], n: int) -> dict[str, Steps]:
    """Each engine's cached greedy decode of n tokens, one step of each engine in turn, and right after
    each step that engine's products alone (its 49 one-row matrix products in sequence). A step and
    its products are timed within milliseconds of each other, so the machine's drift hardly
    touches their ratio; within the step, its products and its attention are timed as they run."""
    loops, seqs, clocks = {}, {}, {}
    for name, m in engines.items():
        m, clocks[name] = clocked(m)
        seqs[name] = Sequence(make_requests(m, [prompt], {"max_new_tokens": n, "stop_at_eos": False})[0])
        loops[name] = cached_steps(m, seqs[name])
    alone = {name: products(m.kernels.linear, 1) for name, m in engines.items()}
    runs = {name: [] for name in engines}  # per step: (step, products in it, attention in it, products alone)
    for _ in range(n):
        for name, loop in loops.items():
            clocks[name].update(products=0.0, attention=0.0)
            start = time.perf_counter()
            next(loop)
            step = time.perf_counter() - start
            runs[name].append((step, clocks[name]["products"], clocks[name]["attention"], alone[name]()))
    return {name: Steps(seqs[name].tokens, *map(list, zip(*runs[name][1:]))) for name in engines}


def minigpt_naive(model: Model, prompt: list[int], n: int) -> list[float]:
    return generate(model, prompt, n, use_cache=False, stop_at_eos=False).step_seconds


def minigpt_prefill(model: Model, prompt: list[int]) -> float:
    start = time.perf_counter()
    model.forward(prompt, model.new_cache(len(prompt)), logits_to_keep=1)
    return time.perf_counter() - start


def without_products(model: Model, keys: int) -> Callable[[], float]:
    """A run that times what a decode step over `keys` positions (the new one included) does besides
    its matrix products: the whole step with every product answered from a table of outputs of its
    shape, its cache with room to the end of its last page, as a generation's. Returns its seconds."""
    table: dict[tuple[int, int], np.ndarray] = {}

    def answered(x: np.ndarray, w: np.ndarray, bias) -> np.ndarray:
        return table.setdefault((x.shape[0], w.shape[1]), np.zeros((x.shape[0], w.shape[1]), np.float32))

    kernels = model.kernels
    stub = dataclasses.replace(model, kernels=dataclasses.replace(kernels, linear=answered))
    context = keys - 1  # the positions before the step
    cache = new_cache(model.config, PAGE * pages_for(keys))
    forward_cached(model, list(range(context)), cache)

    def step() -> float:
        cache.length = context
        start = time.perf_counter()
        forward_cached(stub, [0], cache, logits_to_keep=1)
        return time.perf_counter() - start
    return step


def side_by_side(hf: Transformers | None, minigpt_fn: Callable, hf_fn: Callable, *args,
                 more: dict[str, Callable] | None = None) -> dict[str, list]:
    """`minigpt_fn(model, *args)` for both kernel sets and `hf_fn(hf, *args)` when transformers is
    installed, with the runs of `more`, in interleaved rounds; each engine's (and run's) results."""
    runs = {name: partial(minigpt_fn, model, *args) for name, model in minigpt_engines().items()}
    if hf is not None:
        runs["transformers"] = partial(hf_fn, hf, *args)
    return interleaved({**runs, **(more or {})})


def run() -> Report:
    info = RunInfo()
    model, hf, engines = random_124m(), transformers(), minigpt_engines()
    short, long_prompt, one = fixed_prompt(model, DECODE_PROMPT), fixed_prompt(model, FLAT_PROMPT), [0]
    for m in engines.values():
        generate(m, short, 2, stop_at_eos=False)  # warm-up
    logits_diff = None if hf is None else float(np.abs(hf.logits(short) - model.forward(short, logits_to_keep=1)[0]).max())

    log("decode: cached decode, the products alone and the rest of a step ...")
    keys = DECODE_PROMPT + DECODE_TOKENS // 2  # the middle step's positions, its new one included
    runs: dict[str, Callable] = {"minigpt": partial(lockstep, engines, short, DECODE_TOKENS)}
    if hf is not None:
        runs["transformers"] = partial(hf.cached, short, DECODE_TOKENS)
    for name, m in engines.items():
        runs[f"rest {name}"] = partial(median_of, without_products(m, keys))
        runs[f"attention {name}"] = partial(median_of, attention_alone(m, [keys]))
    runs["products x @ W"] = partial(median_of, products(plain_product, 1))
    measured = interleaved(runs)
    lock = {name: [r[name] for r in measured["minigpt"]] for name in engines}  # per round, Steps
    decode = {name: [(r.tokens, r.seconds) for r in rounds] for name, rounds in lock.items()}  # as transformers'
    if hf is not None:
        decode["transformers"] = measured["transformers"]
    reference = decode["minigpt exact"][0][0]
    names = list(decode)
    decode_ms = {name: min(statistics.median(r[1]) for r in rounds) * 1e3 for name, rounds in decode.items()}
    same_tokens = {name: all(r[0] == reference for r in rounds) for name, rounds in decode.items()}
    alone = {name: min(statistics.median(r.alone) for r in lock[name]) * 1e3 for name in engines}
    # within the step, in its best round (the fastest median step): its products, the rest, the attention
    in_step = {}
    for name in engines:
        best = min(lock[name], key=lambda r: statistics.median(r.seconds))
        in_step[name] = [statistics.median(v) * 1e3 for v in (
            best.products, [s - p for s, p in zip(best.seconds, best.products)], best.attention)]
    rest = {name: min(measured[f"rest {name}"]) * 1e3 for name in engines}
    attention = {name: min(measured[f"attention {name}"]) * 1e3 for name in engines}
    plain = min(measured["products x @ W"]) * 1e3
    floor = min(plain, *alone.values())
    # a step against its products, step by step (each step's products timed right after it), in the best round
    over_products = {name: min(statistics.median(s / p for s, p in zip(r.seconds, r.alone)) for r in lock[name])
                     for name in engines}

    log("decode: cached decode after a 512-token prompt ...")
    flat_runs = side_by_side(hf, minigpt_cached, Transformers.cached, long_prompt, FLAT_TOKENS)
    flat_rounds = {name: [s for _, s in rounds] for name, rounds in flat_runs.items()}
    flat = {name: (min(statistics.median(s[:FLAT_WINDOW]) for s in rounds) * 1e3,
                   min(statistics.median(s[-FLAT_WINDOW:]) for s in rounds) * 1e3)
            for name, rounds in flat_rounds.items()}
    flat_series = {name: [t * 1e3 for t in min(rounds, key=sum)] for name, rounds in flat_rounds.items()}

    log("decode: prefill, and its products and its attention alone ...")
    alone_runs = {f"{part} {name}": run for name, m in engines.items()
                  for part, run in (("products", products(m.kernels.linear, PREFILL, head_rows=1)),
                                    ("attention", attention_alone(m, [PREFILL], PREFILL)))}
    prefill = side_by_side(hf, minigpt_prefill, Transformers.prefill, long_prompt[:PREFILL], more=alone_runs)
    prefill_products = {name: min(prefill.pop(f"products {name}")) for name in engines}  # seconds
    prefill_attention = {name: min(prefill.pop(f"attention {name}")) for name in engines}  # seconds
    prefill_tps = {name: PREFILL / min(rounds) for name, rounds in prefill.items()}
    fast_prefill = PREFILL / prefill_tps["minigpt fast"]  # seconds
    # a kernel set's products, and its products and attention, each timed alone, ÷ fast's prefill
    prefill_floors = {name: (p / fast_prefill, (p + prefill_attention[name]) / fast_prefill)
                      for name, p in prefill_products.items()}

    log("decode: naive loop ...")
    naive = side_by_side(hf, minigpt_naive, Transformers.naive, one, NAIVE_TOKENS)
    naive_ms = {name: (min(s[0] for s in rounds) * 1e3, min(s[-1] for s in rounds) * 1e3)
                for name, rounds in naive.items()}

    targets = decode_targets(decode_ms, over_products, flat, naive_ms, prefill_tps, prefill_floors)
    lines = [*info.header(transformers_row(hf)),
             f"### Results (best of {REPEATS} interleaved rounds; GPT-2-small shapes, random-124m, float32)", "",
             "| measurement | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]

    def row(label: str, values: dict[str, str]) -> None:
        lines.append(f"| {label} | " + " | ".join(values.get(e, "–") for e in names) + " |")

    row(f"cached decode, ms/token ({DECODE_PROMPT}-token prompt, median of {DECODE_TOKENS - 1} steps)",
        {e: f"{v:.2f}" for e, v in decode_ms.items()})
    row("  ÷ transformers", {e: f"{v / decode_ms['transformers']:.2f}x" for e, v in decode_ms.items()}
        if "transformers" in decode_ms else {})
    row("  its own products alone (49 one-row products in sequence, right after each step), ms",
        {e: f"{v:.2f}" for e, v in alone.items()})
    row("  step ÷ its products alone (the median over steps of each step's ratio)",
        {e: f"{v:.2f}x" for e, v in over_products.items()})
    row("  in the step (median over steps): its products / the rest / of which attention (12 layers), ms",
        {e: " / ".join(f"{v:.2f}" for v in values) for e, values in in_step.items()})
    row(f"  the rest timed alone, hot (the middle step: {keys} positions): all / of which attention, ms",
        {e: f"{rest[e]:.2f} / {attention[e]:.2f}" for e in engines})
    row(f"  ÷ the floor ({floor:.2f} ms)", {e: f"{v / floor:.2f}x" for e, v in decode_ms.items()})
    row("  same greedy tokens as minigpt exact", {e: "yes" if v else "**no**" for e, v in same_tokens.items()})
    row(f"cached decode after a {FLAT_PROMPT}-token prompt: first {FLAT_WINDOW} / last {FLAT_WINDOW} steps, ms",
        {e: f"{a:.2f} / {b:.2f}" for e, (a, b) in flat.items()})
    row("  flatness (last ÷ first)", {e: f"{b / a:.2f}" for e, (a, b) in flat.items()})
    row(f"prefill {PREFILL} tokens, tokens/s", {e: f"{v:,.0f}" for e, v in prefill_tps.items()})
    row("  ÷ minigpt fast (time)", {e: f"{prefill_tps['minigpt fast'] / v:.2f}x" for e, v in prefill_tps.items()})
    row(f"  its own products alone ({PREFILL} rows through the blocks, one through the LM head), s",
        {e: f"{v:.3f}" for e, v in prefill_products.items()})
    row("    ÷ minigpt fast's prefill (time): what no prefill of these kernels beats",
        {e: f"{v:.2f}x" for e, (v, _) in prefill_floors.items()})
    row(f"  its own attention alone ({PREFILL} queries over their keys, 12 layers), s",
        {e: f"{v:.3f}" for e, v in prefill_attention.items()})
    row("    products and attention, each timed alone, ÷ minigpt fast's prefill",
        {e: f"{v:.2f}x" for e, (_, v) in prefill_floors.items()})
    row(f"naive loop, one-token prompt: token 1 / token {NAIVE_TOKENS}, ms",
        {e: f"{a:.1f} / {b:.1f}" for e, (a, b) in naive_ms.items()})
    row(f"  staircase (token {NAIVE_TOKENS} ÷ token 1)", {e: f"{b / a:.2f}" for e, (a, b) in naive_ms.items()})
    lines += ["", read_note(floor, model) + f" The same products as `x @ W` (one gemv each) took {plain:.2f} ms."]
    if logits_diff is not None:
        lines.append(f"Same weights: transformers' last-position logits differ from minigpt exact's by at most "
                     f"{logits_diff:.1e}.")

    def plot(path: Path) -> None:
        """Cached per-token time after the 512-token prompt, per engine, with the floor."""
        title = (f"Cached decode per token after a {FLAT_PROMPT}-token prompt, GPT-2-small shapes\n"
                 "(token 1, which includes the prefill, not shown; scripts/benchmark.py)")
        plot_latencies(flat_series, path, title, first_token=2, floor=("the floor: the products alone", floor))

    return Report(info, "\n".join(lines), targets, {"decode.png": plot})


def decode_targets(decode_ms: dict[str, float], over_products: dict[str, float], flat: dict[str, tuple[float, float]],
                   naive_ms: dict[str, tuple[float, float]], prefill_tps: dict[str, float],
                   prefill_floors: dict[str, tuple[float, float]]) -> list[Target]:
    """What one-sequence decode is held to: its own products, transformers, flat, a visible staircase,
    exact prefill near fast's, fast prefill at transformers'."""
    exact, fast = decode_ms["minigpt exact"], decode_ms["minigpt fast"]
    rows = []
    for name, ratio in over_products.items():
        rows.append((f"{name}: a one-row step <= 1.15x its own products alone", f"{ratio:.2f}x", ratio <= 1.15))
    if "transformers" in decode_ms:
        ratio = exact / decode_ms["transformers"]
        rows.append(("exact decode <= 0.6x transformers' ms/token", f"{ratio:.2f}x", ratio <= 0.6))
    first, last = flat["minigpt exact"]
    rows.append((f"cached per-token time flat: last {FLAT_WINDOW} / first {FLAT_WINDOW} steps after a "
                 f"{FLAT_PROMPT}-token prompt <= 1.3", f"{last / first:.2f}", last / first <= 1.3))
    t1, t40 = naive_ms["minigpt exact"]
    rows.append(("naive staircase visible: token 40 / token 1 >= 1.5 (one-token prompt)",
                 f"{t40 / t1:.2f}", t40 / t1 >= 1.5))
    rows.append(("exact decode within 1.15x of fast", f"{exact / fast:.2f}x", exact / fast <= 1.15))
    ratio = prefill_tps["minigpt fast"] / prefill_tps["minigpt exact"]
    alone, with_attention = prefill_floors["minigpt exact"]
    rows.append((f"exact prefill of {PREFILL} tokens <= 2x fast's time",
                 f"{ratio:.2f}x (its products alone {alone:.2f}x, with its attention alone {with_attention:.2f}x)",
                 ratio <= 2))
    if "transformers" in prefill_tps:
        ratio = prefill_tps["minigpt fast"] / prefill_tps["transformers"]
        rows.append((f"fast prefill of {PREFILL} tokens >= transformers' tokens/s", f"{ratio:.2f}x", ratio >= 1))
    return rows
