"""speculative: plain decode against speculative decoding with four drafters.

random-124m (exact kernels), greedy, one 16-token prompt, 128 new tokens, draft_tokens 4. The
prompt is the first of default_rng(0), default_rng(1), ... whose plain greedy continuation settles
into a cycle (random-weight models repeat themselves under greedy decoding), so that prompt lookup
has something to find. Drafters: prompt lookup, the model itself (every draft accepted: the upper
bound on acceptance, at the price of a full decode per draft), random-tiny (GPT-2's vocabulary,
random weights) and one that is always wrong (the overhead). Each drafter is wrapped to record the
k every propose() call is given and the time it spends; a step that drafts nothing has k = 0.
tokens/s = 128 / wall time of the whole call (prefill included). In the same rounds: what verifying
k + 1 = 5 rows costs against one row, a cached step and the products alone (the exact kernels'
products of 5 rows read each block of weights from memory once and from cache four more times).
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import numpy as np

from minigpt.cache.kv_cache import forward_cached, new_cache
from minigpt.loop.loops import cached_steps
from minigpt.loading.loader import load
from minigpt.requests.request import make_requests
from minigpt.loop.sequence import Sequence
from minigpt.engine.drafters import Drafter, ModelDrafter, NGramDrafter
from minigpt.engine.speculative import DraftCounts, speculative_steps

from .common import (REPEATS, Report, RunInfo, Target, gemv_rate, interleaved, log, median_of, multiply_adds,
                     products, random_124m, run_lengths)

TITLE, DOC, BLOCK = "More tokens per read", "speculative.md", "speculative"
PROMPT_TOKENS, NEW_TOKENS, DRAFT_TOKENS = 16, 128, 4
MAX_TRIES = 20  # prompts tried for a repeating continuation
MAX_PERIOD, MAX_CYCLE_START = 8, 16  # a cycle: period <= 8 tokens, entered within the first 16 tokens
SHOWN_RUNS = 24  # runs of k shown per case


class Recorder:
    """A drafter wrapped to record the k each propose() call gets and the seconds it takes."""

    def __init__(self, drafter: Drafter):
        self.drafter, self.ks, self.seconds = drafter, [], 0.0

    def propose(self, ids, k, options, rng):
        self.ks.append(k)
        clock = time.perf_counter()
        proposal = self.drafter.propose(ids, k, options, rng)
        self.seconds += time.perf_counter() - clock
        return proposal

    def accepted(self, n_positions):
        self.drafter.accepted(n_positions)


class AlwaysWrong:
    """Proposes k copies of a token the model never chooses after this prompt: every draft is rejected."""

    def __init__(self, token: int):
        self.token = token

    def propose(self, ids, k, options, rng):
        return [self.token] * k, None

    def accepted(self, n_positions):
        pass


def cycle(tokens: list[int]) -> tuple[int, int] | None:
    """(start, period) of the shortest cycle the tokens stay in from `start` on (period <= MAX_PERIOD,
    start <= MAX_CYCLE_START), or None."""
    for begin in range(MAX_CYCLE_START + 1):
        tail = tokens[begin:]
        for period in range(1, MAX_PERIOD + 1):
            if all(tail[i] == tail[i - period] for i in range(period, len(tail))):
                return begin, period
    return None


def decode(model, prompt: list[int], drafter: Drafter | None) -> dict:
    """Generate NEW_TOKENS greedily (speculating with `drafter` unless None), step by step: tokens,
    wall seconds, steps, the k of every step, drafted/accepted counts and the drafter's seconds."""
    recorder = None if drafter is None else Recorder(drafter)
    seq = Sequence(make_requests(model, [prompt], {"max_new_tokens": NEW_TOKENS, "stop_at_eos": False})[0])
    counts = DraftCounts()
    loop = (cached_steps(model, seq) if recorder is None else
            speculative_steps(model, seq, recorder, DRAFT_TOKENS, counts))
    ks, asked = [], 0
    clock = time.perf_counter()
    for _ in loop:  # one step each
        ks.append(recorder.ks[-1] if recorder and len(recorder.ks) > asked else 0)
        asked = len(recorder.ks) if recorder else 0
    seconds = time.perf_counter() - clock
    result = seq.result(use_cache=True)
    return {"tokens": result.tokens, "seconds": seconds, "steps": len(ks), "ks": ks, "drafted": counts.drafted,
            "accepted": counts.accepted, "draft_seconds": recorder.seconds if recorder else 0.0}


def verify_step(model, prompt: list[int], rows: int):
    """A run of one cached step of `rows` new positions after the prompt (rows = k + 1: a
    speculative verification; 1: a plain decode step). Returns its seconds."""
    cache = new_cache(model.config, len(prompt) + rows)
    forward_cached(model, prompt, cache)

    def run() -> float:
        cache.length = len(prompt)
        start = time.perf_counter()
        forward_cached(model, prompt[:rows], cache)
        return time.perf_counter() - start
    return run


def find_repeating_prompt(model) -> tuple[int, list[int], list[int], tuple[int, int]]:
    """The first seed whose 16 random prompt tokens continue (greedily) into a cycle: seed, prompt,
    its plain tokens, (start, period)."""
    for seed in range(MAX_TRIES):
        prompt = np.random.default_rng(seed).integers(model.config.vocab_size, size=PROMPT_TOKENS).tolist()
        tokens = decode(model, prompt, None)["tokens"]
        found = cycle(tokens)
        if found is not None:
            return seed, prompt, tokens, found
        log(f"speculative: prompt seed {seed} does not cycle: {shorten(run_lengths(tokens))}")
    raise RuntimeError(f"none of {MAX_TRIES} prompts continues into a cycle of period <= {MAX_PERIOD}")


def shorten(runs: str, n: int = SHOWN_RUNS) -> str:
    parts = runs.split(", ")
    return ", ".join(parts[:n]) + (f", … ({len(parts) - n} more runs)" if len(parts) > n else "")


def run() -> Report:
    info = RunInfo()
    model, tiny = random_124m(), load("random-tiny")
    log("speculative: looking for a prompt whose greedy continuation repeats ...")
    seed, prompt, plain_tokens, (begin, period) = find_repeating_prompt(model)
    wrong = next(t for t in range(model.config.vocab_size) if t not in plain_tokens)
    capacity = len(prompt) + NEW_TOKENS - 1  # the positions a request holds at most (Request.max_positions)
    cases = {"plain decode": lambda: None,
             "prompt lookup (ngram)": NGramDrafter,
             "the model itself": lambda: ModelDrafter(model, capacity),
             "random-tiny draft model": lambda: ModelDrafter(tiny, capacity),
             f"always wrong (token {wrong})": lambda: AlwaysWrong(wrong)}
    log("speculative: plain and speculative decoding ...")
    rows = DRAFT_TOKENS + 1
    verify = {"step of 1 row": partial(median_of, verify_step(model, prompt, 1)),
              f"step of {rows} rows": partial(median_of, verify_step(model, prompt, rows)),
              "products of 1 row": partial(median_of, products(model.kernels.linear, 1)),
              f"products of {rows} rows": partial(median_of, products(model.kernels.linear, rows)),
              "gemv rate": gemv_rate()}
    rounds = interleaved({**{name: lambda make=make: decode(model, prompt, make()) for name, make in cases.items()},
                          **verify})
    verify = {name: rounds.pop(name) for name in verify}
    ms = {name: min(v) * 1e3 for name, v in verify.items() if name != "gemv rate"}
    ceiling = (ms["products of 1 row"] + DRAFT_TOKENS * multiply_adds(model) / max(verify["gemv rate"]) * 1e3)
    step_ratio = statistics.median(a / b for a, b in zip(verify[f"step of {rows} rows"], verify["step of 1 row"]))
    best = {name: min(results, key=lambda r: r["seconds"]) for name, results in rounds.items()}
    same = {name: all(r["tokens"] == plain_tokens for r in results) for name, results in rounds.items()}
    plain_tps = NEW_TOKENS / best["plain decode"]["seconds"]

    stats = {}
    for name, r in best.items():
        tps, verify_tps = NEW_TOKENS / r["seconds"], NEW_TOKENS / (r["seconds"] - r["draft_seconds"])
        acceptance = r["accepted"] / r["drafted"] if r["drafted"] else None
        stats[name] = (tps, verify_tps, acceptance)
    targets = speculative_targets(stats, plain_tps, same, step_ratio)

    lines = [*info.header(),
             f"### Results (best of {REPEATS} interleaved rounds; random-124m, exact kernels, float32, greedy, "
             f"{NEW_TOKENS} new tokens, draft_tokens {DRAFT_TOKENS})", "",
             f"The prompt: {PROMPT_TOKENS} random tokens from default_rng({seed}), the first of seeds 0, 1, ... "
             f"whose greedy continuation settles into a cycle. Plain decoding enters a cycle of period {period} "
             f"after {begin} tokens: {shorten(run_lengths(plain_tokens))} (token×repeats). "
             f"tokens/s = {NEW_TOKENS} / wall time of the whole call, prefill included; a step is one forward of "
             "the model over its new rows (the first also prefills the prompt).", "",
             "| drafter | tokens/s | ÷ plain | drafted | accepted | acceptance | drafts per step | tokens per step | "
             "tokens/s without the drafter's time | ÷ plain | tokens = plain |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for name, r in best.items():
        tps, verify_tps, acceptance = stats[name]
        lines.append(f"| {name} | {tps:.1f} | {tps / plain_tps:.2f}x | {r['drafted']} | {r['accepted']} | "
                     + ("–" if acceptance is None else f"{acceptance:.2f}")
                     + f" | {r['drafted'] / r['steps']:.2f} | {NEW_TOKENS / r['steps']:.2f} | {verify_tps:.1f} | "
                     f"{verify_tps / plain_tps:.2f}x | {'yes' if same[name] else '**no**'} |")
    lines += ["", f"Verifying {rows} rows (k = {DRAFT_TOKENS}) against one row, in the same rounds (ms, after the "
              f"{PROMPT_TOKENS}-token prompt): a cached step of {rows} rows {ms[f'step of {rows} rows']:.1f}, of one row "
              f"{ms['step of 1 row']:.1f}: **{step_ratio:.2f}x** (median of the rounds' ratios); the products alone "
              f"{ms[f'products of {rows} rows']:.1f} against {ms['products of 1 row']:.1f} "
              f"({ms[f'products of {rows} rows'] / ms['products of 1 row']:.2f}x). By matrix-vector products the "
              f"{DRAFT_TOKENS} rows after the first cost at least {DRAFT_TOKENS} x a step's multiply-adds at the best "
              f"rate gemv reaches here ({max(verify['gemv rate']) / 1e9:.1f} G/s), so {rows} rows take at least "
              f"{ceiling:.1f} ms = {ceiling / ms['products of 1 row']:.2f}x one row's products.",
              "", f"k given to the drafter at each step (run lengths, k×steps; 0: a plain step), first {SHOWN_RUNS} "
              "runs:", ""]
    lines += [f"- {name}: {shorten(run_lengths(r['ks']))}" for name, r in best.items() if name != "plain decode"]
    lines += ["", "The model as its own draft decodes one token per draft with the full model: every draft is "
              "accepted, but drafting alone costs as much as plain decoding of the same tokens, so it cannot beat "
              "plain decoding. "
              "The column without the drafter's time shows what verification alone gives at that acceptance."]
    return Report(info, "\n".join(lines), targets)


def speculative_targets(stats: dict, plain_tps: float, same: dict[str, bool], step_ratio: float) -> list[Target]:
    """What speculation is held to: k + 1 rows at most 1.3x one row's step; prompt lookup >= 1.6x plain
    at acceptance >= 0.8 with k = 4 (a draft model pays a decode per draft); >= 0.85x plain when always wrong; every run's tokens those of plain decoding."""
    rows = [(f"a step of k + 1 = {DRAFT_TOKENS + 1} rows <= 1.3x one row's", f"{step_ratio:.2f}x", step_ratio <= 1.3)]
    for name, (tps, _, acceptance) in stats.items():
        ratio = tps / plain_tps
        if name.startswith("prompt lookup") and acceptance is not None and acceptance >= 0.8:
            rows.append((f"{name}: acceptance {acceptance:.2f} >= 0.8, so >= 1.6x plain tokens/s", f"{ratio:.2f}x",
                         ratio >= 1.6))
        if name.startswith("always wrong"):
            rows.append((f"{name}: >= 0.85x plain tokens/s", f"{ratio:.2f}x", ratio >= 0.85))
    rows.append(("every speculative run's tokens equal plain decoding's (all rounds)",
                 f"{sum(same.values())}/{len(same)} cases", all(same.values())))
    return rows
