"""How the kernels cut the weights into blocks, chosen for the machine they run on.

The exact kernels' bits do not depend on how the weights are cut into blocks, nor on which thread
computes a block (docs/exactness.md, point 3), so the cut can follow the machine: one row takes
large blocks, which OpenBLAS splits between its threads; several rows take blocks whose share per
thread stays in that thread's L2 while every row passes over it, split by OpenBLAS when a block is
large enough for it to split, else shared between minigpt's own threads. The fast kernels switch
from those per-row products to one gemm at a row count. Without a measurement all of it comes from
the caches the kernel reports (sysfs); `python -m minigpt tune` (minigpt.exact.tuner) measures this machine on the
model's own shapes, in seconds, and keeps the choice in the user's cache directory per CPU, BLAS
build and thread count, as FFTW keeps its wisdom. MINIGPT_TUNING=off ignores a kept choice.
"""

from __future__ import annotations

import json
import os
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
