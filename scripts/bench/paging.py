"""paging: a stream of requests through continuous batching on the paged KV pool.

64 requests on random-124m (exact kernels), greedy, never stopping at end of text. Prompt lengths
are drawn uniformly from 16 .. 512 tokens and reply lengths uniformly from 8 .. 128 tokens (numpy's
default_rng(SEED)), the prompt tokens uniformly from the vocabulary. Three ways:

- one by one: minigpt.generate in a loop (measured once: it takes the longest);
- batched, ample pool: an Engine with max_batch_size 16 and the default pool (16 whole contexts);
- batched, tight pool: half the pages the ample run used at its peak (at least the largest
  request's), so that sequences are preempted and recomputed.

tokens/s = generated tokens / wall time of the whole stream (prefills included). The batched runs
use an Engine without its prefix cache (the prompts share nothing), so that the pool's peak can be read.
"""

from __future__ import annotations

import numpy as np

from minigpt.engine.engine import Engine
from minigpt.api.api import generate
from minigpt.requests.request import make_requests
from minigpt.engine.paging import PAGE, pages_for

from .common import Report, RunInfo, Target, log, random_124m, timed

TITLE, DOC, BLOCK = "Paging and scheduling", "paging.md", "paging"
N_REQUESTS, SEED = 64, 0
PROMPT_RANGE, REPLY_RANGE = (16, 512), (8, 128)
MAX_BATCH = 16
BATCHED_ROUNDS = 2  # each batched run takes a minute or more: two interleaved rounds, the best kept


def stream(vocab_size: int) -> tuple[list[list[int]], list[int]]:
    """The requests: prompts and reply lengths, from a fixed seed."""
    rng = np.random.default_rng(SEED)
    prompt_lengths = rng.integers(PROMPT_RANGE[0], PROMPT_RANGE[1] + 1, N_REQUESTS)
    replies = rng.integers(REPLY_RANGE[0], REPLY_RANGE[1] + 1, N_REQUESTS).tolist()
    return [rng.integers(vocab_size, size=n).tolist() for n in prompt_lengths], replies


def batched(model, prompts: list[list[int]], replies: list[int], kv_cache_tokens: int | None) -> dict:
    """One batched run of the stream: tokens per request, wall seconds, preemptions, the pool's
    peak and page size, and the peak over steps of what the running requests would have reserved
    (prompt + max_new_tokens each)."""
    options = dict(max_new_tokens=replies, temperature=0.0, top_k=None, top_p=None, seed=None, stop=None,
                   stop_at_eos=False, top_logprobs=0)
    requests = make_requests(model, prompts, options)
    engine = Engine(model, max_batch_size=MAX_BATCH, kv_cache_tokens=kv_cache_tokens, prefix_cache=False)
    pool, jobs = engine.pool, engine.jobs_for(requests)
    reserved = [0]

    def on_tokens(_: int) -> None:  # a job holds pages exactly while it is running
        running = [r for r, job in zip(requests, jobs) if job.cache.pages]
        reserved[0] = max(reserved[0], sum(len(r.prompt) + r.max_new_tokens for r in running))

    def go() -> list:
        results = [None] * len(requests)
        for i, result in engine.results(jobs, on_tokens):
            results[i] = result
        return results

    results, seconds = timed(go)
    return {"tokens": [r.tokens for r in results], "seconds": seconds,
            "preemptions": sum(r.preemptions for r in results), "n_pages": pool.n_pages,
            "peak_pages": pool.peak_in_use, "page_bytes": pool.page_bytes, "reserved_positions": reserved[0]}


def run() -> Report:
    info = RunInfo()
    model = random_124m()
    prompts, replies = stream(model.config.vocab_size)
    generate(model, prompts[0][:16], 2, stop_at_eos=False)  # warm-up
    generated, fed = sum(replies), sum(map(len, prompts))

    log(f"paging: {N_REQUESTS} requests one by one ...")
    alone, alone_seconds = timed(lambda: [generate(model, p, n, stop_at_eos=False).tokens
                                          for p, n in zip(prompts, replies)])
    log("paging: batched, ample pool (its peak sizes the tight pool) ...")
    rounds = {"ample": [batched(model, prompts, replies, None)], "tight": []}
    largest = max(len(p) + n - 1 for p, n in zip(prompts, replies))
    tight_pages = max(pages_for(largest), rounds["ample"][0]["peak_pages"] // 2)
    for i in range(BATCHED_ROUNDS):  # ample, tight, ample, tight, ...: interleaved, the first ample run included
        log(f"paging: batched, tight pool ({tight_pages} pages) ...")
        rounds["tight"].append(batched(model, prompts, replies, tight_pages * PAGE))
        if i + 1 < BATCHED_ROUNDS:
            log("paging: batched, ample pool ...")
            rounds["ample"].append(batched(model, prompts, replies, None))
    best = {name: min(results, key=lambda r: r["seconds"]) for name, results in rounds.items()}
    same = {name: all(r["tokens"] == alone for r in results) for name, results in rounds.items()}

    ample, tight = best["ample"], best["tight"]
    position_bytes = ample["page_bytes"] // PAGE
    full = MAX_BATCH * model.config.n_positions * position_bytes
    tps = {"one by one": generated / alone_seconds, "ample": generated / ample["seconds"],
           "tight": generated / tight["seconds"]}
    targets = paging_targets(tps, ample["peak_pages"] * ample["page_bytes"], full, same)

    mb = 2**20
    lines = [*info.header(),
             f"### Results (random-124m, exact kernels, float32; one by one measured once, each batched run the "
             f"best of {BATCHED_ROUNDS} interleaved rounds)", "",
             f"{N_REQUESTS} requests, prompt lengths uniform in {PROMPT_RANGE[0]}..{PROMPT_RANGE[1]} tokens "
             f"(total {fed:,}), reply lengths uniform in {REPLY_RANGE[0]}..{REPLY_RANGE[1]} (total {generated:,} "
             f"generated tokens), seed {SEED}; greedy, no end-of-text stop, max_batch_size {MAX_BATCH}. "
             f"tokens/s = generated tokens / wall time of the whole stream, prefills included. "
             f"KV memory: {position_bytes:,} bytes per position, {ample['page_bytes']:,} per {PAGE}-position page.",
             "", "| run | pool, pages | wall, s | tokens/s | ÷ one by one | preemptions | peak KV | "
             "peak reserved by prompt + max_new_tokens | tokens equal one by one |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
             f"| one by one (`generate` in a loop) | – | {alone_seconds:.1f} | {tps['one by one']:.1f} | 1.00x | – "
             f"| – | – | (reference) |"]
    for name, r in best.items():
        peak = r["peak_pages"] * r["page_bytes"]
        lines.append(f"| batched, {name} pool | {r['n_pages']:,} | {r['seconds']:.1f} | {tps[name]:.1f} | "
                     f"{tps[name] / tps['one by one']:.2f}x | {r['preemptions']} | {peak / mb:,.0f} MiB "
                     f"({peak / full:.0%} of full) | {r['reserved_positions'] * position_bytes / mb:,.0f} MiB | "
                     f"{'yes' if same[name] else '**no**'} |")
    lines += ["", f"Full reservation: {MAX_BATCH} running requests × {model.config.n_positions} positions × "
              f"{position_bytes:,} bytes = {full / mb:,.0f} MiB. The tight pool holds {tight_pages} pages: half the "
              f"ample run's peak ({ample['peak_pages']} pages), at least the largest request's {pages_for(largest)}."]
    return Report(info, "\n".join(lines), targets)


def paging_targets(tps: dict[str, float], peak_bytes: int, full_bytes: int, same: dict[str, bool]) -> list[Target]:
    """What paging is held to: the stream's gain, the peak memory, exact recomputation."""
    ratio = tps["ample"] / tps["one by one"]
    return [(f"ample pool, max_batch_size {MAX_BATCH}: >= 3x one-by-one tokens/s", f"{ratio:.2f}x", ratio >= 3),
            ("peak KV memory <= 50% of full reservation", f"{peak_bytes / full_bytes:.0%}",
             peak_bytes <= full_bytes / 2),
            ("tight pool: every request's tokens equal its one-by-one tokens",
             "yes" if same["tight"] else "no", same["tight"])]
