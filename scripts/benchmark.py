"""Benchmark minigpt on GPT-2-small shapes against transformers and the memory-bandwidth floor.

    PYTHONPATH=. python scripts/benchmark.py [--markdown docs/benchmarks.md] [--plot docs/img/decode.png]

Everything is measured in one run, side by side, and reported as ratios (timings on a shared
machine are noisy; ratios measured together are not much). Each measurement is repeated, the
engines interleaved, and the best repeat kept: interference only ever adds time. Measured:

- cached decode ms/token: minigpt (exact and fast kernels) and, when installed, transformers +
  torch on CPU with the same weights (written with minigpt.checkpoint.save_checkpoint), float32,
  use_cache=True, greedy, the same prompt and number of tokens, the same thread count;
- the bandwidth floor: bytes of weight matrices read per decoded token / read bandwidth
  measured here (np.sum, np.max, a BLAS sdot and sgemv over a 1 GiB float32 array; the best);
- prefill tokens/s (512 tokens), exact vs fast (and transformers);
- flatness: median of the last 16 / first 16 cached steps after a 512-token prompt;
- the naive loop's time for token 1 and token 40 from a one-token prompt.

With --markdown the results replace the block between the markers in that file (docs/benchmarks.md);
the prose around it is kept. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from minigpt.checkpoint import save_checkpoint  # noqa: E402
from minigpt.cost import ARCHITECTURES, estimate  # noqa: E402
from minigpt.errors import MinigptError  # noqa: E402
from minigpt.generate import generate  # noqa: E402
from minigpt.kernels import FAST  # noqa: E402
from minigpt.loading import load  # noqa: E402
from minigpt.model import Model  # noqa: E402
from minigpt.staircase import fixed_prompt, plot_latencies, require_matplotlib  # noqa: E402

BEGIN, END = "<!-- benchmark:begin -->", "<!-- benchmark:end -->"
REPEATS = 3
DECODE_PROMPT, DECODE_TOKENS = 16, 64  # short context: the weights dominate, as in the floor
FLAT_PROMPT, FLAT_TOKENS, FLAT_WINDOW = 512, 129, 16
PREFILL = 512
NAIVE_TOKENS = 40
BANDWIDTH_BYTES = 2**30


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- the machine


def machine() -> dict[str, str]:
    """What the numbers depend on: CPU, caches, memory, library versions, threads, environment."""
    cpu = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        key, _, value = line.partition(":")
        cpu.setdefault(key.strip(), value.strip())
    caches = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        level, kind = (index / "level").read_text().strip(), (index / "type").read_text().strip()
        if kind != "Instruction":
            caches.append(f"L{level} {(index / 'size').read_text().strip()}")
    mem_kib = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("MemTotal")), 0) if Path("/proc/meminfo").exists() else 0
    blas = blas_info()
    info = {
        "CPU": f"{cpu.get('model name', platform.processor())} (family {cpu.get('cpu family', '?')}, "
               f"model {cpu.get('model', '?')}), {os.cpu_count()} logical CPUs; caches per core/shared: "
               f"{', '.join(caches) or 'unknown'}",
        "memory": f"{mem_kib / 2**20:.0f} GiB",
        "OS": platform.platform(),
        "Python, NumPy": f"{platform.python_version()}, numpy {np.__version__}",
        "BLAS": f"{blas['name']} {blas['version']} ({blas['architecture']} kernels), {blas['threads']} threads",
        "environment": " ".join(f"{k}={v}" for k, v in sorted(os.environ.items())
                                if k.startswith(("OPENBLAS_", "OMP_", "MKL_"))) or "(no OPENBLAS_/OMP_/MKL_ vars)",
    }
    return info


def blas_info() -> dict[str, str]:
    try:
        import threadpoolctl
    except ImportError:
        return {"name": "BLAS", "version": "?", "architecture": "?", "threads": str(os.cpu_count())}
    for pool in threadpoolctl.threadpool_info():
        if pool["user_api"] == "blas":
            return {"name": pool["internal_api"], "version": pool.get("version") or "?",
                    "architecture": pool.get("architecture") or "?", "threads": str(pool["num_threads"])}
    return {"name": "BLAS", "version": "?", "architecture": "?", "threads": str(os.cpu_count())}


# ----------------------------------------------------------------------------- measurements


def best_time(fn: Callable[[], object], repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def read_bandwidth() -> dict[str, float]:
    """Bytes read per second by kernels that stream a 1 GiB float32 array once; sgemv is decode's own pattern."""
    a = np.ones(BANDWIDTH_BYTES // 4, np.float32)  # written now: every page is resident
    half, matrix, x = a.size // 2, a.reshape(-1, 4096), np.ones(4096, np.float32)
    ways = {"np.sum": lambda: np.sum(a), "np.max": lambda: np.max(a), "sdot (a @ b)": lambda: a[:half] @ a[half:],
            "sgemv (A @ x)": lambda: matrix @ x}
    return {name: a.nbytes / best_time(fn) for name, fn in ways.items()}


def interleaved(engines: dict[str, Model], hf: Transformers | None, minigpt_fn: Callable, hf_fn: Callable,
                *args) -> dict[str, list]:
    """`minigpt_fn(model, *args)` for each minigpt engine and `hf_fn(hf, *args)` when transformers is
    installed, over REPEATS rounds, the engines taking turns within a round; each engine's results."""
    runs = {name: partial(minigpt_fn, model, *args) for name, model in engines.items()}
    if hf is not None:
        runs["transformers"] = partial(hf_fn, hf, *args)
    results = {name: [] for name in runs}
    for _ in range(REPEATS):
        for name, fn in runs.items():
            results[name].append(fn())
    return results


def minigpt_engines(model_exact: Model) -> dict[str, Model]:
    return {"minigpt exact": model_exact, "minigpt fast": dataclasses.replace(model_exact, kernels=FAST)}


def minigpt_cached(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """The greedy tokens and the seconds of each cached step after the first (which includes the prefill)."""
    result = generate(model, prompt, n, stop_at_eos=False)
    return result.tokens, result.step_seconds[1:]


def minigpt_naive(model, prompt: list[int], n: int) -> list[float]:
    return generate(model, prompt, n, use_cache=False, stop_at_eos=False).step_seconds


def minigpt_prefill(model, prompt: list[int]) -> float:
    start = time.perf_counter()
    model.forward(prompt, model.new_cache(len(prompt)), last_only=True)
    return time.perf_counter() - start


class Transformers:
    """The same weights in transformers' GPT2LMHeadModel, float32, eval, inference mode, greedy."""

    def __init__(self, model, threads: int):
        import torch
        import transformers

        torch.set_num_threads(threads)
        self.torch, self.version = torch, f"torch {torch.__version__}, transformers {transformers.__version__}"
        with tempfile.TemporaryDirectory() as directory:
            save_checkpoint(directory, model.config, model.params)
            self.model = transformers.GPT2LMHeadModel.from_pretrained(directory, dtype=torch.float32).eval()
        self.threads = torch.get_num_threads()
        self.attention = self.model.config._attn_implementation

    def logits(self, prompt: list[int]) -> np.ndarray:
        with self.torch.inference_mode():
            return self.model(self.torch.tensor([prompt]), logits_to_keep=1).logits[0, -1].numpy()

    def cached(self, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
        """Tokens and the seconds of each step after the first, as `minigpt_cached`."""
        torch = self.torch
        tokens, seconds = [], []
        with torch.inference_mode():
            ids, past = torch.tensor([prompt]), None
            for _ in range(n):
                start = time.perf_counter()
                out = self.model(ids, past_key_values=past, use_cache=True, logits_to_keep=1)
                ids, past = out.logits[:, -1].argmax(-1, keepdim=True), out.past_key_values
                seconds.append(time.perf_counter() - start)
                tokens.append(int(ids))
        return tokens, seconds[1:]

    def naive(self, prompt: list[int], n: int) -> list[float]:
        torch = self.torch
        seq, seconds = list(prompt), []
        with torch.inference_mode():
            for _ in range(n):
                start = time.perf_counter()
                out = self.model(torch.tensor([seq]), use_cache=False, logits_to_keep=1)
                seq.append(int(out.logits[0, -1].argmax()))
                seconds.append(time.perf_counter() - start)
        return seconds

    def prefill(self, prompt: list[int]) -> float:
        torch = self.torch
        with torch.inference_mode():
            start = time.perf_counter()
            self.model(torch.tensor([prompt]), use_cache=True, logits_to_keep=1)
            return time.perf_counter() - start


def load_transformers(model, threads: int) -> Transformers | None:
    try:
        return Transformers(model, threads)
    except ImportError as e:
        log(f"transformers/torch not installed ({e.name}): comparing minigpt with the floor only")
        return None


@dataclasses.dataclass
class Results:
    machine: dict[str, str]
    bandwidth: dict[str, float]  # way -> bytes/s
    weight_bytes: int
    decode_ms: dict[str, float]  # engine -> ms/token
    same_tokens: dict[str, bool]  # engine -> its greedy tokens equal minigpt exact's
    logits_diff: float | None  # max |transformers - minigpt exact| over a prompt's last logits
    prefill_tps: dict[str, float]
    flat: dict[str, tuple[float, float]]  # engine -> (median ms of first 16 steps, of last 16)
    flat_series: dict[str, list[float]]  # engine -> ms per cached step after the 512-token prompt (best round)
    naive_ms: dict[str, tuple[float, float]]  # engine -> (token 1, token 40)
    load: tuple[float, float]  # 1-minute load average at start and end

    @property
    def floor_ms(self) -> float:
        return self.weight_bytes / max(self.bandwidth.values()) * 1e3


def run_benchmark() -> Results:
    load_start = os.getloadavg()[0]
    info = machine()
    log("bandwidth ...")
    bandwidth = read_bandwidth()
    model = load("random-124m")
    engines = minigpt_engines(model)
    hf = load_transformers(model, int(blas_info()["threads"]))
    if hf is not None:
        info["torch, transformers"] = f"{hf.version}; torch threads {hf.threads}, attention {hf.attention}"
    short, long_prompt, one = fixed_prompt(model, DECODE_PROMPT), fixed_prompt(model, FLAT_PROMPT), [0]
    for m in engines.values():
        generate(m, short, 2, stop_at_eos=False)  # warm-up
    logits_diff = None if hf is None else float(np.abs(hf.logits(short) - model.forward(short, last_only=True)[0]).max())

    log("cached decode ...")
    decode = interleaved(engines, hf, minigpt_cached, Transformers.cached, short, DECODE_TOKENS)
    reference = decode["minigpt exact"][0][0]
    decode_ms = {name: min(statistics.median(s) for _, s in rounds) * 1e3 for name, rounds in decode.items()}
    same_tokens = {name: all(tokens == reference for tokens, _ in rounds) for name, rounds in decode.items()}

    log("cached decode after a 512-token prompt ...")
    flat_runs = interleaved(engines, hf, minigpt_cached, Transformers.cached, long_prompt, FLAT_TOKENS)
    flat_rounds = {name: [s for _, s in rounds] for name, rounds in flat_runs.items()}
    flat = {name: (min(statistics.median(s[:FLAT_WINDOW]) for s in rounds) * 1e3,
                   min(statistics.median(s[-FLAT_WINDOW:]) for s in rounds) * 1e3)
            for name, rounds in flat_rounds.items()}
    flat_series = {name: [t * 1e3 for t in min(rounds, key=sum)] for name, rounds in flat_rounds.items()}

    log("prefill ...")
    prefill = interleaved(engines, hf, minigpt_prefill, Transformers.prefill, long_prompt[:PREFILL])
    prefill_tps = {name: PREFILL / min(rounds) for name, rounds in prefill.items()}

    log("naive loop ...")
    naive = interleaved(engines, hf, minigpt_naive, Transformers.naive, one, NAIVE_TOKENS)
    naive_ms = {name: (min(s[0] for s in rounds) * 1e3, min(s[-1] for s in rounds) * 1e3)
                for name, rounds in naive.items()}

    weight_bytes = estimate(ARCHITECTURES["gpt2"], 1, 1).weight_bytes_per_token
    return Results(info, bandwidth, weight_bytes, decode_ms, same_tokens, logits_diff, prefill_tps, flat,
                   flat_series, naive_ms, (load_start, os.getloadavg()[0]))


# ----------------------------------------------------------------------------- the report


def targets(r: Results) -> list[tuple[str, str, bool]]:
    """(target, measured, met) for every target of issue 4 (and issues 2/3's exact vs fast)."""
    exact, fast = r.decode_ms["minigpt exact"], r.decode_ms["minigpt fast"]
    rows = []
    if "transformers" in r.decode_ms:
        ratio = exact / r.decode_ms["transformers"]
        rows.append(("cached decode <= 0.6x transformers' ms/token", f"{ratio:.2f}x", ratio <= 0.6))
    ratio = exact / r.floor_ms
    rows.append(("cached decode <= 1.3x the bandwidth floor", f"{ratio:.2f}x", ratio <= 1.3))
    first, last = r.flat["minigpt exact"]
    rows.append((f"cached per-token time flat: last {FLAT_WINDOW} / first {FLAT_WINDOW} steps after a "
                 f"{FLAT_PROMPT}-token prompt <= 1.3", f"{last / first:.2f}", last / first <= 1.3))
    t1, t40 = r.naive_ms["minigpt exact"]
    rows.append(("naive staircase visible: token 40 / token 1 >= 1.5 (one-token prompt)",
                 f"{t40 / t1:.2f}", t40 / t1 >= 1.5))
    rows.append(("exact decode within 1.15x of fast", f"{exact / fast:.2f}x", exact / fast <= 1.15))
    ratio = r.prefill_tps["minigpt fast"] / r.prefill_tps["minigpt exact"]
    rows.append((f"exact prefill of {PREFILL} tokens within 4x of fast", f"{ratio:.2f}x", ratio <= 4))
    return rows


def markdown(r: Results) -> str:
    engines = list(r.decode_ms)
    gb = 1e9
    best_way = max(r.bandwidth, key=r.bandwidth.get)
    lines = ["### Machine", "", "| | |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in r.machine.items()]
    lines += [f"| 1-minute load average (this run's own threads included) | {r.load[0]:.2f} at the start, {r.load[1]:.2f} at the end |", "",
              "### Results (best of 3 interleaved rounds; GPT-2-small shapes, random-124m, float32)", "",
              "| measurement | " + " | ".join(engines) + " |", "| --- |" + " ---: |" * len(engines)]

    def row(label: str, values: dict[str, str]) -> None:
        lines.append(f"| {label} | " + " | ".join(values.get(e, "–") for e in engines) + " |")

    row(f"cached decode, ms/token ({DECODE_PROMPT}-token prompt, median of {DECODE_TOKENS - 1} steps)",
        {e: f"{v:.2f}" for e, v in r.decode_ms.items()})
    row("  ÷ transformers", {e: f"{v / r.decode_ms['transformers']:.2f}x" for e, v in r.decode_ms.items()}
        if "transformers" in r.decode_ms else {})
    row(f"  ÷ bandwidth floor ({r.floor_ms:.2f} ms)", {e: f"{v / r.floor_ms:.2f}x" for e, v in r.decode_ms.items()})
    row("  same greedy tokens as minigpt exact", {e: "yes" if v else "**no**" for e, v in r.same_tokens.items()})
    row(f"cached decode after a {FLAT_PROMPT}-token prompt: first {FLAT_WINDOW} / last {FLAT_WINDOW} steps, ms",
        {e: f"{a:.2f} / {b:.2f}" for e, (a, b) in r.flat.items()})
    row("  flatness (last ÷ first)", {e: f"{b / a:.2f}" for e, (a, b) in r.flat.items()})
    row(f"prefill {PREFILL} tokens, tokens/s", {e: f"{v:,.0f}" for e, v in r.prefill_tps.items()})
    row("  ÷ minigpt fast (time)", {e: f"{r.prefill_tps['minigpt fast'] / v:.2f}x" for e, v in r.prefill_tps.items()})
    row(f"naive loop, one-token prompt: token 1 / token {NAIVE_TOKENS}, ms",
        {e: f"{a:.1f} / {b:.1f}" for e, (a, b) in r.naive_ms.items()})
    row(f"  staircase (token {NAIVE_TOKENS} ÷ token 1)", {e: f"{b / a:.2f}" for e, (a, b) in r.naive_ms.items()})
    lines += ["", "Read bandwidth over a 1 GiB float32 array (best of 5): "
              + ", ".join(f"{k} {v / gb:.1f} GB/s" for k, v in r.bandwidth.items())
              + f". Floor = {r.weight_bytes:,} bytes (every block weight matrix and the tied LM head, float32, "
              f"read once per token; biases, LayerNorm vectors and one embedding row left out) / {best_way}'s "
              f"{r.bandwidth[best_way] / gb:.1f} GB/s = **{r.floor_ms:.2f} ms/token**."]
    if r.logits_diff is not None:
        lines.append(f"Same weights: transformers' last-position logits differ from minigpt exact's by at most "
                     f"{r.logits_diff:.1e}.")
    lines += ["", "### Targets", "", "| target | measured | |", "| --- | ---: | --- |"]
    lines += [f"| {t} | {m} | {'met' if ok else '**missed**'} |" for t, m, ok in targets(r)]
    return "\n".join(lines)


def write_block(path: Path, block: str) -> None:
    """Replace what stands between the markers in `path` (or append the markers and the block)."""
    text = path.read_text() if path.exists() else ""
    if BEGIN in text and END in text:
        before, rest = text.split(BEGIN, 1)
        text = before + BEGIN + "\n" + block + "\n" + END + rest.split(END, 1)[1]
    else:
        text += f"\n{BEGIN}\n{block}\n{END}\n"
    path.write_text(text)


def plot(r: Results, path: Path) -> None:
    """Cached per-token time after the 512-token prompt, per engine, with the bandwidth floor."""
    title = (f"Cached decode per token after a {FLAT_PROMPT}-token prompt, GPT-2-small shapes\n"
             "(token 1, which includes the prefill, not shown; scripts/benchmark.py)")
    plot_latencies(r.flat_series, path, title, first_token=2, floor=("bandwidth floor (weights only)", r.floor_ms))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", type=Path, help="replace the results block in this file (docs/benchmarks.md)")
    parser.add_argument("--plot", type=Path, help="write the cached per-token plot here (matplotlib)")
    args = parser.parse_args(argv)
    if args.plot:
        try:
            require_matplotlib()  # now, not after minutes of measuring
        except MinigptError as e:
            parser.error(str(e))
    results = run_benchmark()
    block = markdown(results)
    print(block)
    if args.markdown:
        write_block(args.markdown, block)
    if args.plot:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
