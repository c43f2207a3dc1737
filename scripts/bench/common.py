"""What every section of the benchmark shares: the machine's description, the bandwidth floor, the
models, transformers on the same weights, interleaved best-of rounds, and the markdown it writes."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import platform
import sys
import tempfile
import time
from functools import cache
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from minigpt.checkpoint import save_checkpoint
from minigpt.cost import ARCHITECTURES, estimate
from minigpt.kernels import FAST, threads as blas_threads
from minigpt.loading import load
from minigpt.model import Model

ROOT = Path(__file__).resolve().parents[2]  # the checkout
REPEATS = 3  # interleaved rounds; the best is kept
BANDWIDTH_BYTES = 2**30
T = TypeVar("T")


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
    return {
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


def blas_info() -> dict[str, str]:
    """NumPy's BLAS as NumPy was built with it, the CPU kernels OpenBLAS chose at start-up (they depend
    on the CPU and on OPENBLAS_CORETYPE, and decide the bits of every product) and its thread count."""
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    return {"name": blas.get("name", "BLAS"), "version": blas.get("version", "?"), "architecture": openblas_core(),
            "threads": str(blas_threads())}


def openblas_core() -> str:
    """openblas_get_corename() of the OpenBLAS this process loaded (scipy-openblas prefixes its symbols), or "?"."""
    maps = Path("/proc/self/maps")
    for library in {p for p in maps.read_text().split() if "openblas" in p and ".so" in p} if maps.exists() else ():
        for symbol in ("openblas_get_corename", "scipy_openblas_get_corename64_", "scipy_openblas_get_corename"):
            corename = getattr(ctypes.CDLL(library), symbol, None)
            if corename is not None:
                corename.restype = ctypes.c_char_p
                return corename().decode()
    return "?"


# ----------------------------------------------------------------------------- measuring


def best_time(fn: Callable[[], object], repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def timed(fn: Callable[[], T]) -> tuple[T, float]:
    """fn's result and its wall time in seconds."""
    start = time.perf_counter()
    result = fn()
    return result, time.perf_counter() - start


def interleaved(runs: dict[str, Callable[[], T]], rounds: int = REPEATS) -> dict[str, list[T]]:
    """Each run's results over `rounds` rounds, the runs taking turns within a round: interference
    from other processes then falls on all of them alike, and the best round is kept by the caller."""
    results = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            results[name].append(fn())
    return results


@cache
def read_bandwidth() -> dict[str, float]:
    """Bytes read per second by kernels that stream a 1 GiB float32 array once; sgemv is decode's own
    pattern. Measured once per run, for every section that needs the floor."""
    log("read bandwidth ...")
    a = np.ones(BANDWIDTH_BYTES // 4, np.float32)  # written now: every page is resident
    half, matrix, x = a.size // 2, a.reshape(-1, 4096), np.ones(4096, np.float32)
    ways = {"np.sum": lambda: np.sum(a), "np.max": lambda: np.max(a), "sdot (a @ b)": lambda: a[:half] @ a[half:],
            "sgemv (A @ x)": lambda: matrix @ x}
    return {name: a.nbytes / best_time(fn) for name, fn in ways.items()}


def weight_bytes() -> int:
    """Bytes of weight matrices one GPT-2-small decode step reads (minigpt.cost)."""
    return estimate(ARCHITECTURES["gpt2"], 1, 1).weight_bytes_per_token


def floor_ms() -> float:
    """The bandwidth floor: ms per decoded token if reading the weights were all it took."""
    return weight_bytes() / max(read_bandwidth().values()) * 1e3


def bandwidth_note() -> str:
    """The markdown sentence that says how the floor was obtained."""
    bandwidth, gb = read_bandwidth(), 1e9
    best = max(bandwidth, key=bandwidth.get)
    return ("Read bandwidth over a 1 GiB float32 array (best of 5): "
            + ", ".join(f"{k} {v / gb:.1f} GB/s" for k, v in bandwidth.items())
            + f". Floor = {weight_bytes():,} bytes (every block weight matrix and the tied LM head, float32, "
            f"read once per token; biases, LayerNorm vectors and one embedding row left out) / {best}'s "
            f"{bandwidth[best] / gb:.1f} GB/s = **{floor_ms():.2f} ms/token**.")


# ----------------------------------------------------------------------------- the engines


@cache
def random_124m() -> Model:
    """random-124m (GPT-2 small's shapes, hence its cost) with the exact kernels."""
    return load("random-124m")


def minigpt_engines() -> dict[str, Model]:
    """The same weights with both kernel sets."""
    return {"minigpt exact": random_124m(), "minigpt fast": dataclasses.replace(random_124m(), kernels=FAST)}


class Transformers:
    """The same weights in transformers' GPT2LMHeadModel, float32, eval, inference mode, greedy."""

    def __init__(self, source: Model, threads: int):
        import torch
        import transformers

        torch.set_num_threads(threads)
        self.torch, self.version = torch, f"torch {torch.__version__}, transformers {transformers.__version__}"
        with tempfile.TemporaryDirectory() as directory:
            save_checkpoint(directory, source.config, source.params)
            self.model = transformers.GPT2LMHeadModel.from_pretrained(directory, dtype=torch.float32).eval()
        self.threads = torch.get_num_threads()
        self.attention = self.model.config._attn_implementation
        self.pad = source.config.eos_token_id  # GPT-2 has no padding token; masked out anyway

    @property
    def description(self) -> str:
        return f"{self.version}; torch threads {self.threads}, attention {self.attention}"

    def logits(self, prompt: list[int]) -> np.ndarray:
        with self.torch.inference_mode():
            return self.model(self.torch.tensor([prompt]), logits_to_keep=1).logits[0, -1].numpy()

    def cached(self, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
        """Greedy tokens and the seconds of each cached step after the first (which includes the prefill)."""
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

    def batch(self, prompts: list[list[int]], n: int) -> tuple[list[list[int]], list[float]]:
        """transformers' batched `generate`: prompts left-padded to the longest with an attention mask,
        greedy, use_cache, exactly n new tokens each (no end-of-text stop). Returns the tokens and the
        wall time of each step after the first (which includes the prefill), timed by a streamer,
        which `generate` hands each step's new tokens."""
        torch = self.torch
        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad] * (width - len(p)) + p for p in prompts])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
        clock = StepClock()
        with torch.inference_mode():
            out = self.model.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, use_cache=True,
                                      eos_token_id=None, pad_token_id=self.pad, streamer=clock)
        return out[:, width:].tolist(), np.diff(clock.times[1:]).tolist()


class StepClock:
    """A transformers streamer that only notes when each step's tokens arrive (the first call: the prompt)."""

    def __init__(self):
        self.times: list[float] = []

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


@cache
def transformers() -> Transformers | None:
    """transformers on random-124m's weights with as many threads as NumPy's BLAS, or None when not installed."""
    try:
        return Transformers(random_124m(), int(blas_info()["threads"]))
    except ImportError as e:
        log(f"transformers/torch not installed ({e.name}): minigpt is compared with itself and the floor only")
        return None


# ----------------------------------------------------------------------------- the report


Target = tuple[str, str, bool]  # (target, measured, met)


class RunInfo:
    """A section's run: the machine and the load average at its start, for its report's header."""

    def __init__(self):
        self.machine = machine()
        self.load_start = os.getloadavg()[0]
        self.date = time.strftime("%Y-%m-%d %H:%M")

    def header(self, extra: dict[str, str] | None = None) -> list[str]:
        """The machine table, with the load average at the start of the run and now."""
        rows = {**self.machine, **(extra or {}),
                "1-minute load average (this run's own threads included)":
                    f"{self.load_start:.2f} at the start, {os.getloadavg()[0]:.2f} at the end"}
        return ["### Machine", "", "| | |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in rows.items()), ""]

    def summary(self, title: str, targets: list[Target]) -> str:
        """The section's targets, met or missed, for the terminal at the end of a run (never the docs)."""
        return "\n".join([f"{title}, measured {self.date} (1-minute load {self.load_start:.2f} at the start, "
                          f"{os.getloadavg()[0]:.2f} at the end):", "", *targets_table(targets)])


@dataclasses.dataclass
class Report:
    """A section's results: when and where, its markdown block for the docs, the targets it is checked
    against (printed, not written into the docs) and the plots it can draw."""

    info: RunInfo
    block: str
    targets: list[Target]
    plots: dict[str, Callable[[Path], None]] = dataclasses.field(default_factory=dict)  # file name in docs/img


def transformers_row(hf: Transformers | None) -> dict[str, str]:
    """The machine table's row for torch and transformers, when they are there."""
    return {} if hf is None else {"torch, transformers": hf.description}


def targets_table(targets: list[Target]) -> list[str]:
    return ["| target | measured | |", "| --- | ---: | --- |",
            *(f"| {t} | {m} | {'met' if ok else '**missed**'} |" for t, m, ok in targets)]


def markers(name: str) -> tuple[str, str]:
    """A block's markers; the decode section keeps the original unnamed ones."""
    tag = f"benchmark:{name}:" if name else "benchmark:"
    return f"<!-- {tag}begin -->", f"<!-- {tag}end -->"


def write_block(path: Path, name: str, block: str) -> None:
    """Replace what stands between the block's markers in `path` (or append the markers and the block)."""
    begin, end = markers(name)
    text = path.read_text() if path.exists() else ""
    if begin in text and end in text:
        before, rest = text.split(begin, 1)
        text = before + begin + "\n" + block + "\n" + end + rest.split(end, 1)[1]
    else:
        text += f"\n{begin}\n{block}\n{end}\n"
    path.write_text(text)


def run_lengths(values: list) -> str:
    """A list written compactly: runs of equal values as value×count ("4×12, 3, 0×2")."""
    runs: list[list] = []
    for v in values:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return ", ".join(f"{v}×{n}" if n > 1 else f"{v}" for v, n in runs)
