"""How the exact kernels cut the weights into blocks, chosen for the machine they run on.

The exact kernels' bits do not depend on how the weights are cut into blocks, nor on which thread
computes a block (docs/exactness.md, point 3), so the cut can follow the machine: L2-sized blocks
shared between threads when many rows reuse them, L3-sized ones for a few rows, and the row count
where one starts to beat the other. Without a measurement they come from the caches the kernel
reports (sysfs); `python -m minigpt tune` measures this machine on the model's own shapes, in
seconds, and keeps the choice in the user's cache directory per CPU, BLAS build and thread count,
as FFTW keeps its wisdom. MINIGPT_TUNING=off ignores a kept choice.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from functools import cache
from pathlib import Path

import numpy as np

MIB = 2**20


@dataclass(frozen=True)
class Tuning:
    """exact_linear's cut of the weights; none of it changes a bit of the results."""

    block_elements: int  # weights per block when many rows share it: a share of L2
    l3_block_elements: int  # weights per block when few rows share it: a share of L3
    many_rows: int  # from this many rows on, L2 blocks shared between minigpt's own threads


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
    """From the caches: blocks of 40% of L2 for many rows, of half of L3 (at most 32 MiB) for few,
    many rows from 8 (1 MiB and 32 MiB when the kernel reports none)."""
    l2, l3 = cache_bytes(2) or MIB, cache_bytes(3) or 32 * MIB
    return Tuning(int(0.4 * l2) // 4, min(l3 // 2, 32 * MIB) // 4, 8)


def key() -> str:
    """What a kept choice is valid for: the CPU, the BLAS build and kernels, the thread count."""
    from .kernels import threads  # the kernels read their tuning from here: imported when asked

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


def fastest(candidates: dict, run, rounds: int = 5) -> tuple[object, dict]:
    """The candidate whose run(candidate) took least time, in interleaved rounds (each round times
    every candidate once, so a machine whose speed drifts slows them alike); and each one's best seconds."""
    best = dict.fromkeys(candidates, float("inf"))
    for _ in range(rounds):
        for name, candidate in candidates.items():
            start = time.perf_counter()
            run(candidate)
            best[name] = min(best[name], time.perf_counter() - start)
    return candidates[min(best, key=best.get)], best


def measure(n_embd: int = 768, vocab_size: int = 50257) -> tuple[Tuning, dict[str, dict]]:
    """Time exact_linear on a GPT-2 block's four matrices and its LM head at each candidate cut: the
    fastest cut, and the best seconds of every candidate (decision -> candidate -> seconds)."""
    from . import kernels

    rng = np.random.default_rng(0)
    C = n_embd
    blocks = [rng.standard_normal(shape, dtype=np.float32) for shape in ((3 * C, C), (C, C), (4 * C, C), (C, 4 * C))]
    head = [rng.standard_normal((vocab_size, C), dtype=np.float32)]
    default = machine_default()
    l2 = int(2.5 * default.block_elements)  # elements that fill L2

    def products(weights, rows: int):
        x = [rng.standard_normal((rows, w.shape[1]), dtype=np.float32) for w in weights]

        def run(tuning: Tuning) -> None:
            with kernels.tuned(tuning):
                for xi, w in zip(x, weights):
                    kernels.exact_linear(xi, w, None)
        return run

    report = {}
    shares = {f"{share:.0%} of L2": Tuning(int(l2 * share), default.l3_block_elements, 1)
              for share in (1 / 8, 1 / 4, 2 / 5, 1 / 2, 3 / 4)}
    block = fastest(shares, products(blocks, 16))
    report["blocks shared by 16 rows"] = block[1]
    sizes = {f"{mib} MiB": Tuning(block[0].block_elements, mib * MIB // 4, 10**9) for mib in (2, 4, 8, 16, 32)}
    l3 = fastest(sizes, products(head, 1))
    report["blocks of the LM head for 1 row"] = l3[1]
    many_rows = 10**9  # never, unless shared blocks win at some row count
    for rows in (2, 3, 4, 6, 8, 12, 16):
        ways = {f"{rows} rows, per-row gemv": l3[0], f"{rows} rows, shared blocks": Tuning(
            block[0].block_elements, l3[0].l3_block_elements, 1)}
        winner, seconds = fastest(ways, products(blocks, rows))
        report[f"{rows} rows"] = seconds
        if winner.many_rows == 1:
            many_rows = rows
            break
    return Tuning(block[0].block_elements, l3[0].l3_block_elements, many_rows), report
