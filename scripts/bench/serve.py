"""serve: the completions server under 1, 4, 16 and 32 concurrent clients, against the same requests one at a time.

64 requests on random-124m, greedy, 32 new tokens each (never stopping at end of text), prompts of
16 .. 256 random tokens (numpy's default_rng(SEED)). For each kernel set, `python -m minigpt serve`
runs in a child process on 127.0.0.1 at a free port; C client threads take the requests in turn,
each streaming its answer (server-sent events) and timing every chunk. Time to first token = from
sending the request to its first chunk; time between tokens = the gaps between its chunks. The
reference is minigpt.generate on the same requests one at a time, in this process, without HTTP
(its first step's time for the first token, its other steps' for the gaps). Every streamed answer
is checked against the one-at-a-time text with the exact kernels.
"""

from __future__ import annotations

import http.client
import json
import subprocess
import sys
import threading
import time
from dataclasses import replace
from typing import Callable, TypeVar

import numpy as np

from minigpt.api.api import generate
from minigpt.exact.kernels import FAST
from minigpt.loading.model import Model

from .common import Report, RunInfo, Target, log, random_124m, timed

TITLE, DOC, BLOCK = "Serving", "serving.md", "serve"
N_REQUESTS, NEW_TOKENS, SEED = 64, 32, 0
PROMPT_RANGE = (16, 256)
CONCURRENCY = (1, 4, 16, 32)
MAX_BATCH = 16
T, R = TypeVar("T"), TypeVar("R")


def requests(config, n: int, new_tokens: int) -> list[list[int]]:
    """n prompts from a fixed seed, each short enough to leave room for the new tokens."""
    rng = np.random.default_rng(SEED)
    return [rng.integers(config.vocab_size, size=min(int(k), config.n_positions - new_tokens)).tolist()
            for k in rng.integers(PROMPT_RANGE[0], PROMPT_RANGE[1] + 1, n)]


def percentiles(values: list[float]) -> str:
    """p50 / p99 in ms."""
    return f"{np.percentile(values, 50) * 1e3:.0f} / {np.percentile(values, 99) * 1e3:.0f}"


def one_at_a_time(model: Model, prompts: list[list[int]], new_tokens: int) -> dict:
    """minigpt.generate on each prompt in turn: texts, wall time, first-step and later-step seconds."""
    results, seconds = timed(lambda: [generate(model, p, new_tokens, stop_at_eos=False) for p in prompts])
    return {"texts": [r.text for r in results], "seconds": seconds,
            "ttft": [r.step_seconds[0] for r in results], "tbt": [s for r in results for s in r.step_seconds[1:]]}


def start_server(model_name: str, kernels: str, *options: str) -> tuple[subprocess.Popen, int]:
    """`python -m minigpt serve` with these options on a free port of 127.0.0.1: (process, port) once it listens."""
    process = subprocess.Popen([sys.executable, "-m", "minigpt", "serve", "--model", model_name, "--kernels", kernels,
                                "--port", "0", *options], stderr=subprocess.PIPE, text=True)
    line = process.stderr.readline()
    if " listening on http://127.0.0.1:" not in line:
        process.kill()
        raise RuntimeError(f"the server did not start: {line}")
    return process, int(line.rsplit(":", 1)[1].split()[0])


def stream_one(port: int, prompt: list[int], new_tokens: int) -> tuple[str, list[float]]:
    """The streamed text and the times (perf_counter) of its chunks, the request's start first."""
    times = [time.perf_counter()]
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    connection.request("POST", "/v1/completions", json.dumps({"prompt": prompt, "max_tokens": new_tokens,
                                                              "temperature": 0, "ignore_eos": True, "stream": True}))
    text = []
    for line in connection.getresponse():
        if line.startswith(b"data: {"):
            times.append(time.perf_counter())
            text.append(json.loads(line[6:])["choices"][0]["text"])
    connection.close()
    return "".join(text), times


def in_turn(items: list[T], clients: int, work: Callable[[T], R]) -> tuple[list[R], float]:
    """work(item) for every item from `clients` threads, each taking the next item in turn: the
    results in the items' order, and the wall time of all."""
    results, lock, next_index = [None] * len(items), threading.Lock(), [0]

    def client() -> None:
        while True:
            with lock:
                i = next_index[0]
                next_index[0] += 1
            if i >= len(items):
                return
            results[i] = work(items[i])

    def go() -> None:
        threads = [threading.Thread(target=client) for _ in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    _, seconds = timed(go)
    return results, seconds


def served(port: int, prompts: list[list[int]], new_tokens: int, clients: int) -> dict:
    """The prompts through the server from `clients` threads taking them in turn."""
    answers, seconds = in_turn(prompts, clients, lambda prompt: stream_one(port, prompt, new_tokens))
    texts, chunks = [a[0] for a in answers], [a[1] for a in answers]
    return {"texts": texts, "seconds": seconds, "ttft": [c[1] - c[0] for c in chunks],
            "tbt": [b - a for c in chunks for a, b in zip(c[1:], c[2:])]}


def measure(model_name: str, models: dict[str, Model], n_requests: int, new_tokens: int,
            concurrency: tuple[int, ...]) -> list[dict]:
    """One row per (kernels, way): one at a time, then the server at each concurrency."""
    rows = []
    for kernels, model in models.items():
        prompts = requests(model.config, n_requests, new_tokens)
        generate(model, prompts[0][:16], 2)  # warm-up
        log(f"serve: {kernels}, {n_requests} requests one at a time ...")
        alone = one_at_a_time(model, prompts, new_tokens)
        rows.append({"kernels": kernels, "way": "one at a time (`generate`, no HTTP)", **alone, "same": None})
        process, port = start_server(model_name, kernels, "--max-batch-size", str(MAX_BATCH))
        try:
            for clients in concurrency:
                log(f"serve: {kernels}, {clients} concurrent clients ...")
                result = served(port, prompts, new_tokens, clients)
                rows.append({"kernels": kernels, "way": f"server, {clients} concurrent clients", **result,
                             "same": result["texts"] == alone["texts"], "reference": alone["seconds"]})
        finally:
            process.terminate()
            process.wait(30)
    return rows


def table(rows: list[dict], n_requests: int, new_tokens: int) -> list[str]:
    lines = ["| kernels | way | wall, s | requests/s | tokens/s | ÷ one at a time | time to first token p50 / p99, "
             "ms | time between tokens p50 / p99, ms | text equals one at a time |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in rows:
        ratio = "1.00x" if r["same"] is None else f"{r['reference'] / r['seconds']:.2f}x"
        same = "(reference)" if r["same"] is None else "yes" if r["same"] else "**no**"
        lines.append(f"| {r['kernels']} | {r['way']} | {r['seconds']:.1f} | {n_requests / r['seconds']:.2f} | "
                     f"{n_requests * new_tokens / r['seconds']:.1f} | {ratio} | {percentiles(r['ttft'])} | "
                     f"{percentiles(r['tbt'])} | {same} |")
    return lines


def run() -> Report:
    info = RunInfo()
    models = {"exact": random_124m(), "fast": replace(random_124m(), kernels=FAST)}
    rows = measure("random-124m", models, N_REQUESTS, NEW_TOKENS, CONCURRENCY)
    lines = [*info.header(),
             f"### Results (random-124m, float32, max_batch_size {MAX_BATCH}; one run each)", "",
             f"{N_REQUESTS} requests, prompts of {PROMPT_RANGE[0]}..{PROMPT_RANGE[1]} random tokens (seed {SEED}), "
             f"{NEW_TOKENS} new tokens each, greedy, streamed. tokens/s = generated tokens / wall time of all "
             "requests.", "", *table(rows, N_REQUESTS, NEW_TOKENS)]
    return Report(info, "\n".join(lines), serve_targets(rows))


def serve_targets(rows: list[dict]) -> list[Target]:
    """What the server is held to: exact answers under any concurrency, and a gain from batching."""
    exact = [r for r in rows if r["kernels"] == "exact" and r["same"] is not None]
    best = max(r["reference"] / r["seconds"] for r in exact)
    return [("exact kernels: every streamed text equals one at a time, at every concurrency",
             "yes" if all(r["same"] for r in exact) else "no", all(r["same"] for r in exact)),
            ("exact kernels, 16 or 32 clients: >= 1.5x one-at-a-time requests/s", f"{best:.2f}x", best >= 1.5)]
