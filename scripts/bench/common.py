"""What every section of the benchmark shares: the machine's description, its ceilings (the model's
own products timed alone, gemv's best rate, one gemm per matrix), a forward's attention timed alone,
the models, transformers on the same weights, interleaved best-of rounds, and the markdown it writes."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path
from typing import Callable, TypeVar

import numpy as np

from minigpt.loading.checkpoint_writer import save_checkpoint
from minigpt.exact.attention import BatchPart
from minigpt.exact.kernels import FAST
from minigpt.exact.threads import threads as blas_threads
from minigpt.cache.kv_cache import forward_cached, new_cache
from minigpt.loading.loader import load
from minigpt.loading.model import Model
from minigpt.exact.batched import placement
from minigpt.engine.paging import PAGE, pages_for
from minigpt.exact.tuning import MIB, cache_bytes

ROOT = Path(__file__).resolve().parents[2]  # the checkout
REPEATS = 3  # interleaved rounds; the best is kept
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


def weight_matrices(model: Model) -> list[np.ndarray]:
    """The matrices one decode step multiplies, in the order it reads them: every block's four and
    the tied LM head (49 for GPT-2 small)."""
    return [w for b in model.params.h for w in (b.attn.c_attn.weight, b.attn.c_proj.weight, b.mlp.c_fc.weight,
                                                b.mlp.c_proj.weight)] + [model.params.wte.T]


def multiply_adds(model: Model) -> int:
    """Multiply-adds of those products for one row."""
    return sum(w.size for w in weight_matrices(model))


def products(linear: Callable, rows: int, head_rows: int | None = None) -> Callable[[], float]:
    """A run of the model's own matrix products alone, in sequence, for `rows` rows through `linear`
    (x [rows, n_in] -> [rows, n_out] for every matrix; the LM head's `head_rows`, if given, as a
    prefill keeping one position's logits): no attention, no LayerNorm, no Python of a forward.
    Returns its seconds."""
    weights = weight_matrices(random_124m())
    counts = [rows] * (len(weights) - 1) + [rows if head_rows is None else head_rows]
    xs = [np.random.default_rng(0).standard_normal((n, w.shape[0]), dtype=np.float32) for n, w in zip(counts, weights)]

    def run() -> float:
        start = time.perf_counter()
        for x, w in zip(xs, weights):
            linear(x, w, None)
        return time.perf_counter() - start
    return run


def attention_alone(model: Model, lengths: list[int], queries: int = 1) -> Callable[[], float]:
    """A run of a forward's attention alone, its layers in sequence, through the model's kernels as
    batched.forward_batch calls them: one sequence per entry of `lengths`, each that many positions
    long (their keys and values from a forward, in a cache with room to the end of its last page, as
    a pool's pages give), its last `queries` positions the new ones. No products, no LayerNorm.
    Returns its seconds."""
    config, filled = model.config, {}
    for n in set(lengths):
        filled[n] = new_cache(config, PAGE * pages_for(n))
        forward_cached(model, list(range(n)), filled[n])
        filled[n].length = n - queries
    places = [placement(filled[n].copy(), queries) for n in lengths]  # each sequence its own memory
    rows = [slice(i * queries, (i + 1) * queries) for i in range(len(lengths))]
    q = np.random.default_rng(0).standard_normal((config.n_head, len(lengths) * queries, config.head_dim),
                                                 dtype=np.float32)  # [H, N, hd]

    def run() -> float:
        start = time.perf_counter()
        for layer in range(config.n_layer):
            model.kernels.attend_batch(q, [BatchPart(r, p.length, p.segments(layer)) for p, r in zip(places, rows)])
        return time.perf_counter() - start
    return run


def plain_product(x: np.ndarray, w: np.ndarray, bias: None) -> np.ndarray:
    """x @ w: one BLAS call, gemv for one row and gemm for more."""
    return x @ w


GEMV_BLOCKS = (64, 128, 256, 512, 768, 1024, 1536)  # outputs of a block of 768 inputs: 192 KB to 4.5 MB


def gemv_rate(from_memory: bool = False) -> Callable[[], float]:
    """A run that finds the best rate this machine's gemv reaches, 16 gemvs in a row on a block of
    768 inputs and 64 .. 1536 outputs, [n_in, n_out] as the model's (the 15 after the first read it from cache), each block through
    OpenBLAS's threads and split between minigpt's. In cache: each block three times over, so
    that the best leaves out the first read from memory (a bound no decode step reaches). From
    memory: blocks that follow each other through a pool three times the L3 (at least 96 MB), each
    read from memory once, as a decode step reads its weights. Returns the best multiply-adds per
    second."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 1, 768), dtype=np.float32)
    workers = ThreadPoolExecutor(blas_threads() - 1) if blas_threads() > 1 else None
    if from_memory:
        pool = rng.standard_normal(max(3 * (cache_bytes(3) or 32 * MIB), 96 * MIB) // 4, dtype=np.float32)
        runs = {rows: pool[:pool.size // (rows * 768) * rows * 768].reshape(-1, 768, rows) for rows in GEMV_BLOCKS}
    else:
        runs = {rows: np.broadcast_to(rng.standard_normal((768, rows), dtype=np.float32), (3, 768, rows))
                for rows in GEMV_BLOCKS}  # one block, three times

    def sixteen(blocks: np.ndarray) -> None:
        for w in blocks:
            np.matmul(x, w[None])  # 16 x ([1, 768] @ [768, rows])

    def run() -> float:
        best = 0.0
        for blocks in runs.values():
            for split in (False, True) if workers is not None else (False,):
                for w in blocks[None] if from_memory else blocks[:, None]:  # all at once, or each block alone
                    start = time.perf_counter()
                    if split:
                        shares = np.array_split(w, blas_threads(), axis=0 if from_memory else 2)
                        futures = [workers.submit(sixteen, share) for share in shares[1:]]
                        sixteen(shares[0])
                        for f in futures:
                            f.result()
                    else:
                        sixteen(w)
                    best = max(best, 16 * w.size / (time.perf_counter() - start))
        return best
    return run


def median_of(run: Callable[[], float], n: int = 9) -> float:
    """The median of n runs' seconds (the products' time within one interleaved round)."""
    return statistics.median(run() for _ in range(n))


def read_note(floor_ms: float, model: Model) -> str:
    """The markdown sentence that says what the floor is and the read bandwidth it means."""
    return (f"The floor is the model's own one-row products timed alone, in sequence, best kernel set: "
            f"{len(weight_matrices(model))} matrices, {weight_bytes(model):,} bytes of float32 weights "
            f"read once each, in {floor_ms:.2f} ms: {weight_bytes(model) / floor_ms / 1e6:.1f} GB/s, the read "
            f"bandwidth as decode reads. A decode step does these products and more, so no step beats it.")


def weight_bytes(model: Model) -> int:
    """Bytes of the matrices one decode step reads."""
    return 4 * multiply_adds(model)


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
