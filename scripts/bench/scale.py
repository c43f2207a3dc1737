"""scale: cost as the work grows, minigpt beside transformers.

- load, per GPT-2 size the machine holds: a random float32 checkpoint in Hugging Face's layout,
  loaded in a fresh process by minigpt (`load`, then the first logits of a 16-token prompt) and by
  transformers (`from_pretrained`, then its first forward of the same prompt), in interleaved
  rounds, the best kept: seconds from the call to the logits (imports not counted); then the
  process's memory after the logits (/proc/self/smaps_rollup: resident, anonymous), alone and with
  a second process holding the same checkpoint (each one's shared memory, their summed Pss), against
  the weights' float32 bytes;
- context, on GPT-2 small's shapes (random-124m): a cached decode step after 64 .. 1,000 positions
  and prefill per token of 64 .. 1,000-token prompts, exact, fast and transformers, each against
  its own at the shortest (decode 64, prefill 250); and the bytes a decode step reads, weights plus
  the cache's keys and values, against 64's;
- gpt2-xl's shapes: a decode step after 64 and 1,000 positions, exact and fast.

Every timing is the best of its rounds, the engines taking turns. The file was written just before
its loads, so it is in the page cache: the loads read memory, not the disk.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from minigpt.cache.kv_cache import forward_cached
from minigpt.cli.pictures import plot_lines
from minigpt.exact.kernels import EXACT, FAST
from minigpt.gpt2.config import GPT2_SIZES
from minigpt.loading.checkpoint_writer import save_checkpoint
from minigpt.loading.model import Model
from minigpt.loading.weights import params_to_tensors, random_params
from minigpt.loop.cost import gpt2_architecture, kv_bytes_per_token

from .common import Report, RunInfo, Target, interleaved, log, minigpt_engines, transformers, transformers_row

TITLE, DOC, BLOCK = "Cost as the work grows", "staircase.md", "scale"
SIZES = ("gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl")
LOAD_ROUNDS, ROUNDS, STEPS = 2, 3, 6
DECODE_CONTEXT = (64, 128, 256, 512, 1000)  # 1,000: GPT-2's 1,024 positions leave room for the steps
PREFILL_TOKENS = (64, 128, 250, 500, 1000)
PROMPT = list(range(1000, 1016))  # the load's 16-token prompt

# One load in a fresh process, so that its memory is the load's own. argv: engine, directory, prompt,
# threads. It prints the load's seconds, waits for a line on stdin (the parent's word that every process
# it measures together holds its checkpoint), then prints its memory from /proc/self/smaps_rollup.
LOAD_SCRIPT = """
import json, sys, time
engine, directory, prompt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if engine == "minigpt":
    import minigpt
    start = time.perf_counter()
    model = minigpt.load(directory)
    model.forward(prompt)
else:
    import torch, transformers
    torch.set_num_threads(int(sys.argv[4]))
    start = time.perf_counter()
    model = transformers.GPT2LMHeadModel.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.inference_mode():
        model(torch.tensor([prompt]))
print(json.dumps({"seconds": time.perf_counter() - start}), flush=True)
sys.stdin.readline()
fields = dict(line.split(":") for line in open("/proc/self/smaps_rollup") if line.rstrip().endswith(" kB"))
print(json.dumps({key: int(value.split()[0]) * 1024 for key, value in fields.items()}), flush=True)
"""
MEMORY = ("Rss", "Pss", "Anonymous", "Shared_Clean", "Shared_Dirty")


def read_growth(name: str, contexts: tuple[int, ...]) -> dict[int, float]:
    """The bytes a decode step reads after each context (every weight matrix once, the cache's keys and
    values of the positions so far; minigpt.loop.cost's arithmetic), against those after the first."""
    arch = gpt2_architecture(name, GPT2_SIZES[name])
    read = {n: 4 * arch.matrix_params + n * kv_bytes_per_token(arch, "float32") for n in contexts}
    return {n: read[n] / read[contexts[0]] for n in contexts}


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (0 if unknown)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def held(engine: str, directory: Path, threads: int, n: int = 1) -> list[dict]:
    """n processes loading `engine` at once: each one's seconds and, once all of them hold the
    checkpoint, its memory (MEMORY's fields, bytes)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", LOAD_SCRIPT, engine, str(directory), json.dumps(PROMPT),
                               str(threads)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(n)]
    try:
        timing = [json.loads(p.stdout.readline()) for p in procs]
        for p in procs:
            p.stdin.write("\n")
            p.stdin.flush()
        memory = [json.loads(p.stdout.readline()) for p in procs]
    finally:
        for p in procs:
            p.stdin.close()
            p.wait()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"scale: a {engine} load failed")
    return [{**t, **{k: m[k] for k in MEMORY}} for t, m in zip(timing, memory)]


def gb(n: float, weights: int) -> str:
    """Bytes as GB, with their ratio to the weights'."""
    return f"{n / 1e9:.2f} ({n / weights:.2f}x)"


def loads(engines: list[str], threads: int) -> tuple[list[str], list[str], list[Target]]:
    """The load and memory tables' rows and targets, one size at a time (its checkpoint written,
    loaded, deleted)."""
    rows, memory_rows, targets = [], [], []
    for size in SIZES:
        config = GPT2_SIZES[size]
        weights = 4 * gpt2_architecture(size, config).matrix_params  # nearly all of it: a first estimate
        free_disk = shutil.disk_usage(tempfile.gettempdir()).free
        if 3 * weights > available_bytes() or 2 * weights > free_disk:
            rows.append(f"| {size} | {weights / 1e9:.2f} | not measured: this machine's free memory or disk "
                        f"cannot hold it twice | | |")
            continue
        with tempfile.TemporaryDirectory() as directory:
            log(f"scale: writing a random {size} checkpoint ({weights / 1e9:.1f} GB) ...")
            params = random_params(config, seed=0)
            weights = sum(t.nbytes for t in params_to_tensors(params).values())
            save_checkpoint(directory, config, params)
            del params
            log(f"scale: loading {size}, {', '.join(engines)}, {LOAD_ROUNDS} rounds, then two processes each ...")
            runs = interleaved({e: lambda e=e: held(e, Path(directory), threads)[0] for e in engines}, LOAD_ROUNDS)
            pairs = {e: held(e, Path(directory), threads, 2) for e in engines}
        best = {e: {key: min(r[key] for r in runs[e]) for key in ("seconds", *MEMORY)} for e in engines}
        mine, theirs = best["minigpt"], best.get("transformers")
        cells = [f"{mine['seconds']:.2f}"]
        if theirs:
            speed = mine["seconds"] / theirs["seconds"]
            cells += [f"{theirs['seconds']:.2f}", f"**{speed:.2f}x**"]
            targets.append((f"{size}: load to first logits <= 1.2x transformers'", f"{speed:.2f}x", speed <= 1.2))
        else:
            cells += ["", ""]
        rows.append(f"| {size} | {weights / 1e9:.2f} | " + " | ".join(cells) + " |")
        for e in engines:
            pss = sum(p["Pss"] for p in pairs[e])
            shared = min(p["Shared_Clean"] + p["Shared_Dirty"] for p in pairs[e])
            memory_rows.append(f"| {size} | {e} | {gb(best[e]['Rss'], weights)} | {gb(best[e]['Anonymous'], weights)} "
                               f"| {gb(shared, weights)} | **{gb(pss, weights)}** |")
        anonymous, pss = mine["Anonymous"] / weights, sum(p["Pss"] for p in pairs["minigpt"]) / weights
        targets.append((f"{size}: anonymous memory after the first logits <= 0.15x the weights", f"{anonymous:.2f}x",
                        anonymous <= 0.15))
        targets.append((f"{size}: two processes on one checkpoint, summed Pss <= 1.4x the weights", f"{pss:.2f}x",
                        pss <= 1.4))
    return rows, memory_rows, targets


def decode_step(forward, new_cache, ids: list[int], context: int) -> float:
    """The best of STEPS cached decode steps after `context` positions (one logit row kept)."""
    cache = new_cache()
    forward(ids[:context], cache)
    best = float("inf")
    for i in range(STEPS):
        start = time.perf_counter()
        forward(ids[context + i:context + i + 1], cache)
        best = min(best, time.perf_counter() - start)
    return best


def prefill(forward, new_cache, ids: list[int], n: int) -> float:
    """Seconds per token of one prefill of n tokens into a fresh cache."""
    cache = new_cache()
    start = time.perf_counter()
    forward(ids[:n], cache)
    return (time.perf_counter() - start) / n


def minigpt_engine(model: Model):
    """(forward(ids, cache), new_cache()) for a minigpt model, as the cached loop calls them."""
    return (lambda ids, cache: forward_cached(model, ids, cache, 1)), model.new_cache


def transformers_engine(hf):
    """The same for transformers: a DynamicCache grows through past_key_values, one forward per call."""
    torch = hf.torch

    class Past:
        value = None

    def forward(ids, past):
        with torch.inference_mode():
            out = hf.model(torch.tensor([ids]), past_key_values=past.value, use_cache=True, logits_to_keep=1)
        past.value = out.past_key_values
    return forward, Past


def curves(engines: dict) -> tuple[dict, dict]:
    """Decode seconds per context and prefill seconds per token, per engine, the best of ROUNDS."""
    ids = np.random.default_rng(0).integers(50000, size=1024).tolist()
    decode, fill = {}, {}
    for context in DECODE_CONTEXT:
        log(f"scale: decode after {context} positions, {ROUNDS} rounds ...")
        runs = interleaved({name: lambda e=e: decode_step(*e, ids, context) for name, e in engines.items()}, ROUNDS)
        for name, seconds in runs.items():
            decode.setdefault(name, {})[context] = min(seconds)
    for n in PREFILL_TOKENS:
        log(f"scale: prefill of {n} tokens, {ROUNDS} rounds ...")
        runs = interleaved({name: lambda e=e: prefill(*e, ids, n) for name, e in engines.items()}, ROUNDS)
        for name, seconds in runs.items():
            fill.setdefault(name, {})[n] = min(seconds)
    return decode, fill


def growth_rows(table: dict, base: int, unit: float, label: str) -> list[str]:
    """A markdown table: one row per length, each engine's time and its ratio to its own at `base`."""
    names = list(table)
    head = [f"| {label} | " + " | ".join(f"{n}, ms | ÷ at {base}" for n in names) + " |",
            "| ---: | " + " | ".join("---: | ---:" for _ in names) + " |"]
    lengths = sorted(next(iter(table.values())))
    return head + [f"| {n:,} | " + " | ".join(f"{table[e][n] * unit:.2f} | {table[e][n] / table[e][base]:.2f}x"
                                               for e in names) + " |" for n in lengths]


def run() -> Report:
    hf = transformers()
    info = RunInfo()
    threads = hf.threads if hf is not None else 1
    load_rows, memory_rows, targets = loads(["minigpt", "transformers"] if hf is not None else ["minigpt"], threads)

    small = {name: minigpt_engine(model) for name, model in minigpt_engines().items()}
    if hf is not None:
        small["transformers"] = transformers_engine(hf)
    decode, fill = curves(small)
    read = read_growth("gpt2", DECODE_CONTEXT)  # random-124m has GPT-2 small's shapes
    for name in ("minigpt exact", "minigpt fast"):
        grow = decode[name][1000] / decode[name][64]
        targets.append((f"{name}: decode after 1,000 positions <= 1.2x after 64 (bytes read {read[1000]:.2f}x)",
                        f"{grow:.2f}x", grow <= 1.2))
    linear = fill["minigpt exact"][1000] / fill["minigpt exact"][250]
    targets.append(("minigpt exact: prefill per token at 1,000 tokens <= 1.15x at 250", f"{linear:.2f}x",
                    linear <= 1.15))

    log("scale: gpt2-xl's shapes, decode after 64 and 1,000 positions ...")
    xl_config = GPT2_SIZES["gpt2-xl"]
    xl_params = random_params(xl_config, seed=0)
    xl = {f"minigpt {k.name}": minigpt_engine(Model(xl_config, xl_params, k)) for k in (EXACT, FAST)}
    ids = np.random.default_rng(0).integers(50000, size=1024).tolist()
    xl_decode = {}
    for context in (64, 1000):
        runs = interleaved({name: lambda e=e: decode_step(*e, ids, context) for name, e in xl.items()}, 2)
        for name, seconds in runs.items():
            xl_decode.setdefault(name, {})[context] = min(seconds)
    del xl, xl_params
    xl_read = read_growth("gpt2-xl", (64, 1000))[1000]
    for name, steps in xl_decode.items():
        grow = steps[1000] / steps[64]
        targets.append((f"gpt2-xl, {name}: decode after 1,000 positions <= 1.2x after 64 (bytes read "
                        f"{xl_read:.2f}x)", f"{grow:.2f}x", grow <= 1.2))

    lines = [*info.header(transformers_row(hf)),
             f"### Loading (random float32 checkpoints in Hugging Face's layout, the best of {LOAD_ROUNDS} "
             "interleaved rounds, each load in a fresh process; the file in the page cache)", "",
             "Seconds from the call (`minigpt.load`, `GPT2LMHeadModel.from_pretrained`) to the first logits of "
             "a 16-token prompt.", "",
             "| size | weights, GB | minigpt, s | transformers, s | minigpt ÷ transformers |",
             "| --- | ---: | ---: | ---: | ---: |", *load_rows, "",
             "Memory after the first logits (/proc/self/smaps_rollup, GB and the ratio to the weights' float32 bytes): "
             "one process alone, its resident and anonymous memory (the interpreter and the libraries included); "
             "two processes holding the same checkpoint at once, the memory each shares and their summed Pss "
             "(each shared page counted once between them).", "",
             "| size | engine | resident | anonymous | two processes: shared, each | two processes: summed Pss |",
             "| --- | --- | ---: | ---: | ---: | ---: |", *memory_rows, "",
             f"### Decode against the context (random-124m, GPT-2 small's shapes; the best of {STEPS} steps, "
             f"{ROUNDS} interleaved rounds)", "",
             "A cached decode step after n positions, one logit row kept. It reads every weight once and the "
             "cache's keys and values of the n positions: "
             + ", ".join(f"{read[n]:.2f}x" for n in DECODE_CONTEXT) + " the bytes at 64, for n = "
             + ", ".join(f"{n:,}" for n in DECODE_CONTEXT) + ".", "",
             *growth_rows(decode, 64, 1e3, "positions"), "",
             f"### Prefill against the prompt's length (random-124m; the best of {ROUNDS} interleaved rounds)", "",
             *growth_rows(fill, 250, 1e3, "prompt tokens"), "",
             "### Decode at gpt2-xl's shapes (random weights; the best of 2 interleaved rounds)", "",
             f"Bytes read after 1,000 positions: {xl_read:.2f}x those after 64.", "",
             *growth_rows(xl_decode, 64, 1e3, "positions")]
    plots = {"scale-decode.png": lambda path: plot_lines(
        {name: (list(DECODE_CONTEXT), [decode[name][n] * 1e3 for n in DECODE_CONTEXT]) for name in decode}, path,
        "a cached decode step against the context (random-124m)", xlabel="positions in the cache",
        ylabel="ms per step")}
    return Report(info, "\n".join(lines), targets, plots)
