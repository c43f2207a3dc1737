"""prefix: the Engine's prefix cache, on the two shapes of work that share prefixes most.

random-124m (GPT-2 small's shapes), exact kernels, an Engine with max_batch_size 16 and the
default pool, with its prefix cache on and off (cold: a fresh engine for every run):

- shared prefix: 24 requests, one 480-token prefix (a system prompt, a few-shot preamble) and
  distinct 8-token suffixes, 8 new tokens each, greedy;
- multiple choice: 20 contexts of 300 tokens, each with 4 continuations of 5 tokens, scored only
  (max_new_tokens 0, prompt_logprobs): what an evaluation's loglikelihood requests are.

The token ids are drawn uniformly from the vocabulary (numpy's default_rng(SEED)). Each run is
timed whole; the runs take turns in interleaved rounds and the best of each is kept.
"""

from __future__ import annotations

import numpy as np

from minigpt.engine.engine import Engine

from .common import Report, RunInfo, interleaved, log, random_124m, timed

TITLE, DOC, BLOCK = "Prefix caching", "prefix-cache.md", "prefix"
SEED, ROUNDS, MAX_BATCH = 0, 2, 16
SHARED = dict(requests=24, prefix=480, suffix=8, new_tokens=8)
CHOICE = dict(contexts=20, context=300, choices=4, continuation=5)


def workloads(vocab_size: int) -> dict[str, dict]:
    """The two request sets: prompts and generate() options."""
    rng = np.random.default_rng(SEED)
    ids = lambda n: rng.integers(vocab_size, size=n).tolist()  # noqa: E731
    prefix = ids(SHARED["prefix"])
    shared = [prefix + ids(SHARED["suffix"]) for _ in range(SHARED["requests"])]
    choice = [context + ids(CHOICE["continuation"]) for context in
              (ids(CHOICE["context"]) for _ in range(CHOICE["contexts"])) for _ in range(CHOICE["choices"])]
    return {"shared prefix": {"prompts": shared, "options": dict(max_new_tokens=SHARED["new_tokens"],
                                                                 stop_at_eos=False)},
            "multiple choice": {"prompts": choice, "options": dict(max_new_tokens=0, prompt_logprobs=True)}}


def once(model, work: dict, prefix_cache: bool) -> dict:
    """One cold run on a fresh engine: its results' essentials, wall seconds, peak pages and hits."""
    engine = Engine(model, max_batch_size=MAX_BATCH, prefix_cache=prefix_cache)
    results, seconds = timed(lambda: engine.generate(work["prompts"], **work["options"]))
    return {"seconds": seconds, "peak_pages": engine.pool.peak_in_use, "page_bytes": engine.pool.page_bytes,
            "cached": sum(r.cached_tokens for r in results),
            "results": [(r.tokens, r.logprobs, r.prompt_logprobs) for r in results]}


def run() -> Report:
    info = RunInfo()
    model = random_124m()
    once(model, {"prompts": [[1, 2, 3]], "options": {"max_new_tokens": 2}}, True)  # warm-up
    rows, targets = [], []
    for name, work in workloads(model.config.vocab_size).items():
        log(f"prefix: {name}, {len(work['prompts'])} requests, cache on and off, {ROUNDS} rounds ...")
        runs = interleaved({"on": lambda: once(model, work, True), "off": lambda: once(model, work, False)}, ROUNDS)
        best = {mode: min(results, key=lambda r: r["seconds"]) for mode, results in runs.items()}
        same = all(r["results"] == runs["off"][0]["results"] for results in runs.values() for r in results)
        speedup = best["off"]["seconds"] / best["on"]["seconds"]
        fed = sum(map(len, work["prompts"]))
        rows.append(f"| {name} | {len(work['prompts'])} | {fed:,} | {best['on']['cached']:,} | "
                    f"{best['off']['seconds']:.1f} | {best['on']['seconds']:.1f} | **{speedup:.2f}x** | "
                    f"{best['off']['peak_pages']} | {best['on']['peak_pages']} | {'yes' if same else '**no**'} |")
        goal = 4 if name == "shared prefix" else 3
        targets += [(f"{name}: >= {goal}x faster with the prefix cache", f"{speedup:.2f}x", speedup >= goal),
                    (f"{name}: results bitwise the same with the cache on and off", "yes" if same else "no", same)]
    page_kib = best["on"]["page_bytes"] / 1024
    lines = [*info.header(),
             f"### Results (random-124m, exact kernels, float32; cold engines, max_batch_size {MAX_BATCH}, the "
             f"best of {ROUNDS} interleaved rounds)", "",
             f"Shared prefix: {SHARED['requests']} requests of a {SHARED['prefix']}-token prefix and distinct "
             f"{SHARED['suffix']}-token suffixes, {SHARED['new_tokens']} new tokens each, greedy. Multiple choice: "
             f"{CHOICE['contexts']} contexts of {CHOICE['context']} tokens × {CHOICE['choices']} continuations of "
             f"{CHOICE['continuation']} tokens, scored only (prompt log-probabilities, no new token). Token ids "
             f"uniform from the vocabulary, seed {SEED}. A page holds 16 positions, {page_kib:,.0f} KiB of keys "
             "and values.", "",
             "| workload | requests | prompt tokens | from the cache | cache off, s | cache on, s | speed-up | "
             "peak pages off | peak pages on | results equal |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |", *rows]
    return Report(info, "\n".join(lines), targets)
