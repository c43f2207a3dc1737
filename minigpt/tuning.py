"""How the kernels cut the weights into blocks, chosen for the machine they run on.

The exact kernels' bits do not depend on how the weights are cut into blocks, nor on which thread
computes a block (docs/exactness.md, point 3), so the cut can follow the machine: one row takes
large blocks, which OpenBLAS splits between its threads; several rows take blocks whose share per
thread stays in that thread's L2 while every row passes over it, split by OpenBLAS when a block is
large enough for it to split, else shared between minigpt's own threads. The fast kernels switch
from those per-row products to one gemm at a row count. Without a measurement all of it comes from
the caches the kernel reports (sysfs); `python -m minigpt tune` measures this machine on the
model's own shapes, in seconds, and keeps the choice in the user's cache directory per CPU, BLAS
build and thread count, as FFTW keeps its wisdom. MINIGPT_TUNING=off ignores a kept choice.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np

MIB = 2**20


NEVER = 10**9  # a row count no forward reaches
OPENBLAS_SPLIT = 460_800  # OpenBLAS splits a gemv between its threads from m x n >= 115200 x 4 weights on


@dataclass(frozen=True)
class Tuning:
    """How the kernels cut the weights; none of it changes a bit of the exact kernels' results."""

    row_block: int  # weights per gemv call for one row (a share of L3): OpenBLAS splits each call
    rows_block: int  # weights per gemv call for several rows, every row passing over a block in turn
    shared_block: int  # weights per gemv call when minigpt's own threads share the blocks (a share of L2)
    shared_rows: int  # from this many rows on, shared blocks rather than rows_block ones (NEVER: never)
    gemm_rows: int  # the fast kernels: from this many rows on, one gemm per matrix rather than gemvs


@cache
def threads() -> int:
    """The number of threads OpenBLAS runs, decided as OpenBLAS decides it (once, at start-up): the
    first of OPENBLAS_NUM_THREADS, GOTO_NUM_THREADS, OMP_NUM_THREADS that is set, at most the CPUs
    this process may run on. minigpt's own worker threads are as many."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    for name in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(name, "").strip()
        if value.isdigit() and int(value) >= 1:
            return min(int(value), cpus, 64)
    return min(cpus, 64)


def cache_bytes(level: int) -> int | None:
    """The size of the data cache of `level` that CPU 0 reports (sysfs), or None."""
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if int((index / "level").read_text()) == level and (index / "type").read_text().strip() != "Instruction":
                size = (index / "size").read_text().strip().upper()
                return int(size[:-1]) * {"K": 1024, "M": MIB}[size[-1]] if size[-1] in "KM" else int(size)
        except (OSError, ValueError):
            continue
    return None


def machine_default() -> Tuning:
    """From the caches: one row in blocks of half of L3 (at most 32 MiB); several rows in blocks of
    60% of L2 per thread, OpenBLAS splitting them, or, when such a block is too small for OpenBLAS
    to split, shared between minigpt's threads in blocks of 40% of L2; gemm from 16 rows (1 MiB and
    32 MiB when the kernel reports no caches)."""
    l2, l3 = cache_bytes(2) or MIB, cache_bytes(3) or 32 * MIB
    rows_block = int(0.6 * l2) * threads() // 4
    return Tuning(min(l3 // 2, 32 * MIB) // 4, rows_block, int(0.4 * l2) // 4,
                  NEVER if rows_block >= OPENBLAS_SPLIT or threads() == 1 else 2, 16)


def key() -> str:
    """What a kept choice is valid for: the CPU, the BLAS build and kernels, the thread count."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "?") if Path("/proc/cpuinfo").exists() else "?"
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    return (f"{cpu} | {blas.get('name')} {blas.get('version')} | {os.environ.get('OPENBLAS_CORETYPE', 'auto')} | "
            f"{threads()} threads")


def kept_path() -> Path:
    """The file of kept choices: $XDG_CACHE_HOME/minigpt/tuning.json (~/.cache by default)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minigpt" / "tuning.json"


@cache
def current() -> Tuning:
    """The tuning in force: the kept choice for this machine, else the machine's default."""
    if os.environ.get("MINIGPT_TUNING", "").lower() != "off":
        try:
            return Tuning(**json.loads(kept_path().read_text())[key()])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none kept, or unreadable: the default
    return machine_default()


def keep(tuning: Tuning) -> Path:
    """Keep a measured choice for this machine (other machines' choices in the file stay)."""
    path = kept_path()
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        kept = {}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**kept, key(): asdict(tuning)}, indent=1) + "\n")
    current.cache_clear()
    return path


SETTLE = 0.15  # seconds: longer than OpenBLAS's threads spin after a call (2**28 cycles), taking the CPUs


def fastest(candidates: dict, run, rounds: int = 5, settle: float = 0.0) -> tuple[object, dict]:
    """The candidate whose run(candidate) took least time, in interleaved rounds (each round times
    every candidate once, so a machine whose speed drifts slows them alike); and each one's best
    seconds. With `settle`, a candidate runs untimed for that long before each timing, so that it
    is timed in its own steady state: minigpt's own threads are slow while OpenBLAS's still spin
    after the candidate before."""
    best = dict.fromkeys(candidates, float("inf"))
    for _ in range(rounds):
        for name, candidate in candidates.items():
            until = time.perf_counter() + settle
            while time.perf_counter() < until:
                run(candidate)
            start = time.perf_counter()
            run(candidate)
            best[name] = min(best[name], time.perf_counter() - start)
    return candidates[min(best, key=best.get)], best


def measure(n_embd: int = 768, vocab_size: int = 50257) -> tuple[Tuning, dict[str, dict]]:
    """Time the kernels' products at each candidate cut on a GPT-2 decode step's matrices: blocks'
    four (more of them than the L3 holds, read again until they weigh as GPT-2 small's 12 blocks)
    and the LM head, whose cut matters as much (it is a third of the step's weights): the fastest
    cut, and the best seconds of every candidate (decision -> candidate -> seconds)."""
    from . import kernels

    rng = np.random.default_rng(0)
    C = n_embd
    shapes = ((3 * C, C), (C, C), (4 * C, C), (C, 4 * C))
    # as many blocks' matrices as twice L3 holds (at most GPT-2 small's 12): read from memory, as decode reads them
    n_blocks = min(12, -(-2 * (cache_bytes(3) or 32 * MIB) // (48 * C * C)))
    blocks = [rng.standard_normal(shape, dtype=np.float32) for _ in range(n_blocks) for shape in shapes]
    head = [rng.standard_normal((vocab_size, C), dtype=np.float32)]
    step = blocks * max(1, round(12 / n_blocks)) + head  # a decode step's weights, in their proportions
    choice = machine_default()
    l2 = (cache_bytes(2) or MIB) // 4  # weights that fill one core's L2

    def products(weights, rows: int, linear=kernels.exact_linear):
        x = [rng.standard_normal((rows, w.shape[1]), dtype=np.float32) for w in weights]

        def run(tuning: Tuning) -> None:
            with kernels.tuned(tuning):
                for xi, w in zip(x, weights):
                    linear(xi, w, None)
        return run

    def decide(decision: str, field: str, values: dict, run, **timing) -> None:
        """Set choice's `field` to the fastest of `values` under run."""
        nonlocal choice
        choice, report[decision] = fastest({name: replace(choice, **{field: v}) for name, v in values.items()}, run,
                                           **timing)

    def switch(decision: str, field: str, ways: tuple[str, str], linear, **timing) -> int:
        """The first row count at which the second way beats the first (NEVER: none)."""
        for rows in (2, 3, 4, 6, 8, 12, 16, 32, 64):
            decide(f"{decision}, {rows} rows", field, {ways[0]: NEVER, ways[1]: 1}, products(step, rows, linear),
                   **timing)
            if getattr(choice, field) == 1:
                return rows
        return NEVER

    report: dict[str, dict] = {}
    decide("blocks of the LM head for 1 row", "row_block", {f"{m} MiB": m * MIB // 4 for m in (2, 4, 8, 16, 32)},
           products(head, 1))
    choice = replace(choice, shared_rows=NEVER)
    few, many = products(step, 2), products(step, 16)

    def pair_and_batch(tuning: Tuning) -> None:
        """Two rows four times, then sixteen: a pair of sequences and a batch weigh alike."""
        for _ in range(4):
            few(tuning)
        many(tuning)

    # shares of L2 per thread; with several threads, no less than a block OpenBLAS splits between them
    split = OPENBLAS_SPLIT if threads() > 1 else 0
    sizes = sorted({max(int(l2 * share) * threads(), split) for share in (0.3, 0.6, 0.9, 1, 1.25, 1.5, 2, 3)})
    rows_blocks = {f"{size * 4 / MIB:.2f} MiB": size for size in sizes}
    decide("blocks for 2 rows (x 4) and 16 rows, split by OpenBLAS", "rows_block", rows_blocks, pair_and_batch)
    if threads() > 1:
        choice = replace(choice, shared_rows=1)
        decide("blocks for 16 rows, shared by minigpt's threads", "shared_block",
               {f"{share:.0%} of L2": int(l2 * share) for share in (1 / 8, 1 / 4, 2 / 5, 1 / 2, 3 / 4)},
               products(step, 16))
        choice = replace(choice, shared_rows=switch("exact kernels", "shared_rows",
                                                    ("blocks split by OpenBLAS", "shared blocks"), kernels.exact_linear,
                                                    rounds=3, settle=SETTLE))
        if choice.shared_rows <= 16:  # the batch takes shared blocks: OpenBLAS's split serves fewer rows alone
            decide("blocks for 2 rows, split by OpenBLAS", "rows_block", rows_blocks, few)
    choice = replace(choice, gemm_rows=switch("fast kernels", "gemm_rows", ("gemv per row", "one gemm"),
                                              kernels.fast_linear, rounds=3, settle=SETTLE))
    return choice, report
