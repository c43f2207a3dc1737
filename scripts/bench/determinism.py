"""determinism: one prompt sent N times to a loaded server, greedy and with one seed at temperature 1;
how many distinct completions come back, with the exact kernels and with the fast ones.

Thinking Machines' experiment ("Defeating Nondeterminism in LLM Inference"): one prompt 1,000 times at
temperature 0 to a loaded vLLM server gave 80 distinct completions, the first difference at token
103; with batch-invariant kernels, 1. Here, for each kernel set, `python -m minigpt serve` runs
random-124m (GPT-2 small's shapes, random weights) in a child process on 127.0.0.1 with a page pool
tight enough to preempt and the prefix cache on. CLIENTS client threads take a shuffled list of
requests in turn: the probe N times greedy and N times at temperature 1 with one seed, among LOAD_PER_PROBE
times as many other requests (prompts of other lengths, some beginning with part of the probe: prefix
hits of whole and partial pages; greedy or sampled; streamed or not). The same list, from the same
seed, for both kernel sets. Every probe's tokens and log-probabilities are compared with each other
and with minigpt.generate's for the probe alone, in this process. The server has no speculative
decoding, so the mix has none. `--runs 1000` runs Thinking Machines' size.
"""

from __future__ import annotations

import http.client
import json
from dataclasses import replace

import numpy as np

from minigpt.cli.pictures import plot_lines
from minigpt.exact.kernels import FAST
from minigpt.api.api import generate

from .common import Report, RunInfo, Target, log, random_124m
from .serve import in_turn, start_server

TITLE, DOC, BLOCK = "Determinism under load", "serving.md", "determinism"
RUNS, NEW_TOKENS, PROBE_TOKENS, SEED = 24, 48, 40, 0
LOAD_PER_PROBE, CLIENTS, MAX_BATCH, POOL_TOKENS = 1, 16, 16, 1024
PROBE_SEED = 1234  # the seeded probe's


def schedule(config, runs: int) -> tuple[list[int], list[dict]]:
    """The probe's prompt and every request body in the order clients take them (numpy's default_rng(SEED))."""
    rng = np.random.default_rng(SEED)
    probe = rng.integers(config.vocab_size - 1, size=PROBE_TOKENS).tolist()
    asked = {"max_tokens": NEW_TOKENS, "ignore_eos": True, "logprobs": 0, "return_tokens_as_token_ids": True}
    bodies = [{"prompt": probe, "temperature": 0, **asked} for _ in range(runs)]
    bodies += [{"prompt": probe, "temperature": 1.0, "seed": PROBE_SEED, **asked} for _ in range(runs)]
    for _ in range(2 * runs * LOAD_PER_PROBE):
        shared = probe[:int(rng.integers(1, PROBE_TOKENS))] if rng.random() < 0.3 else []
        prompt = shared + rng.integers(config.vocab_size - 1, size=int(rng.integers(4, 120))).tolist()
        body = {"prompt": prompt, "max_tokens": int(rng.integers(4, NEW_TOKENS + 1)), "stream": bool(rng.random() < 0.5)}
        body.update({"temperature": 0} if rng.random() < 0.5 else {"temperature": 0.8, "seed": int(rng.integers(2**31))})
        bodies.append(body)
    return probe, [bodies[i] for i in rng.permutation(len(bodies))]


def send(port: int, body: dict) -> tuple[tuple[int, ...], tuple[float, ...]] | None:
    """A probe's (tokens, log-probabilities); None for the other requests (read to their end)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        if response.status != 200:
            raise RuntimeError(f"the server answered {response.status}: {data[:200]!r}")
        if "logprobs" not in body:
            return None
        logprobs = json.loads(data)["choices"][0]["logprobs"]
        return (tuple(int(t.removeprefix("token_id:")) for t in logprobs["tokens"]),
                tuple(logprobs["token_logprobs"]))
    finally:
        connection.close()


def metrics(port: int) -> dict[str, float]:
    """/metrics' counters, summed over their labels."""
    from prometheus_client.parser import text_string_to_metric_families

    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    return {family.name: sum(s.value for s in family.samples if s.name.endswith("_total"))
            for family in text_string_to_metric_families(text) if family.type == "counter"}


def served(kernels: str, bodies: list[dict]) -> tuple[list, dict, float]:
    """Every body through a fresh server with `kernels` from CLIENTS threads: the answers in the
    bodies' order, the server's counters and the wall time."""
    process, port = start_server("random-124m", kernels, "--max-batch-size", str(MAX_BATCH),
                                 "--kv-cache-tokens", str(POOL_TOKENS))
    try:
        answers, seconds = in_turn(bodies, CLIENTS, lambda body: send(port, body))
        return answers, metrics(port), seconds
    finally:
        process.terminate()
        process.wait(30)


def first_split(runs: list[tuple]) -> int | None:
    """The first position (1-based, as Thinking Machines counts tokens) where the runs do not all
    agree, or None."""
    for t, values in enumerate(zip(*runs)):
        if len(set(values)) > 1:
            return t + 1
    return None


def distinct_prefixes(runs: list[tuple]) -> list[int]:
    """At each position t, how many distinct sequences the runs' first t + 1 values make."""
    return [len({r[:t + 1] for r in runs}) for t in range(len(runs[0]))]


def row(kernels: str, decoding: str, answers: list, alone) -> dict:
    tokens, logprobs = [a[0] for a in answers], [a[1] for a in answers]
    drift = 0.0  # the largest difference from alone's log-probabilities, up to a run's first token unlike alone's
    for t, lp in zip(tokens, logprobs):
        k = (first_split([t, tuple(alone.tokens)]) or len(t) + 1) - 1
        drift = max(drift, float(np.abs(np.subtract(lp[:k], alone.logprobs[:k])).max(initial=0.0)))
    same_tokens = sum(t == tuple(alone.tokens) for t in tokens)
    return {"kernels": kernels, "decoding": decoding, "runs": len(answers), "completions": len(set(tokens)),
            "first": first_split(tokens), "alone": sum(lp == tuple(alone.logprobs) for lp in logprobs),
            "same_tokens": same_tokens, "bits": len(set(logprobs)), "first_bits": first_split(logprobs),
            "drift": drift,
            "prefixes": distinct_prefixes(logprobs), "token_prefixes": distinct_prefixes(tokens)}


def measure(runs: int) -> tuple[list[dict], dict]:
    rows, load = [], {}
    for kernels in ("exact", "fast"):
        model = random_124m() if kernels == "exact" else replace(random_124m(), kernels=FAST)
        probe, bodies = schedule(model.config, runs)
        greedy = generate(model, probe, NEW_TOKENS, temperature=0, stop_at_eos=False)
        sampled = generate(model, probe, NEW_TOKENS, temperature=1.0, seed=PROBE_SEED, stop_at_eos=False)
        log(f"determinism: {kernels}, {len(bodies)} requests from {CLIENTS} clients ...")
        answers, counters, seconds = served(kernels, bodies)
        for decoding, alone, temperature in (("greedy", greedy, 0), ("temperature 1, one seed", sampled, 1.0)):
            mine = [a for a, b in zip(answers, bodies) if "logprobs" in b and b["temperature"] == temperature]
            rows.append(row(kernels, decoding, mine, alone))
        load[kernels] = {"requests": len(bodies), "seconds": seconds, **counters}
    return rows, load


def dash(value) -> str:
    return "—" if value is None else str(value)


def table(rows: list[dict]) -> list[str]:
    lines = ["| kernels | decoding | runs | distinct completions | first difference at token | runs equal to the "
             "prompt alone (tokens · tokens and log-probabilities) | distinct log-probability sequences (bits) | "
             "first bit difference at token | largest \\|logprob − alone\\| |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['kernels']} | {r['decoding']} | {r['runs']} | {r['completions']} | {dash(r['first'])} | "
                     f"{r['same_tokens']} · {r['alone']} | {r['bits']} | {dash(r['first_bits'])} | {r['drift']:.1e} |")
    return lines


def load_table(load: dict) -> list[str]:
    lines = ["| kernels | requests | wall, s | prompt tokens | tokens generated | prompt tokens from the prefix cache | "
             "preemptions |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for kernels, c in load.items():
        lines.append(f"| {kernels} | {c['requests']} | {c['seconds']:.0f} | {c['minigpt:prompt_tokens']:.0f} | "
                     f"{c['minigpt:generation_tokens']:.0f} | {c['minigpt:prefix_cache_hits']:.0f} | "
                     f"{c['minigpt:num_preemptions']:.0f} |")
    return lines


def run(runs: int = RUNS) -> Report:
    info = RunInfo()
    rows, load = measure(runs)
    lines = [*info.header(),
             f"### Results (random-124m, float32, max_batch_size {MAX_BATCH}, a pool of {POOL_TOKENS} positions, "
             f"{CLIENTS} concurrent clients; one run)", "",
             f"The probe: {PROBE_TOKENS} random tokens (seed {SEED}), {NEW_TOKENS} new tokens, end of text ignored, "
             f"sent {runs} times greedy and {runs} times at temperature 1 with seed {PROBE_SEED}, shuffled among "
             f"{2 * runs * LOAD_PER_PROBE} other requests. A completion is its token ids; \"alone\" is "
             "minigpt.generate's for the probe alone, in-process.", "", *table(rows), "",
             "The load each server carried (its /metrics counters at the end):", "", *load_table(load)]

    def plot(path) -> None:
        series = {f"{r['kernels']}, {r['decoding']}: log-probability bits": (
            list(range(1, NEW_TOKENS + 1)), r["prefixes"]) for r in rows}
        series |= {f"{r['kernels']}, {r['decoding']}: tokens": (list(range(1, NEW_TOKENS + 1)), r["token_prefixes"])
                   for r in rows if r["token_prefixes"] != r["prefixes"]}
        plot_lines(series, path, f"One prompt {runs} times to a loaded server, random-124m (scripts/benchmark.py)",
                   xlabel="token position t", ylabel="distinct runs over tokens 1..t")

    return Report(info, "\n".join(lines), determinism_targets(rows), {"determinism.png": plot})


def determinism_targets(rows: list[dict]) -> list[Target]:
    """The exact kernels are held to one answer, bitwise the prompt's alone; the fast ones are measured."""
    exact = [r for r in rows if r["kernels"] == "exact"]
    one = all(r["completions"] == r["bits"] == 1 and r["alone"] == r["runs"] for r in exact)
    return [("exact kernels: 1 distinct completion and log-probabilities, bitwise the prompt alone, greedy and "
             "seeded", ", ".join(f"{r['completions']} · {r['bits']}" for r in exact), one)]
