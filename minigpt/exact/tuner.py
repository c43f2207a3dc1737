"""The tuner: times the exact and fast kernels' products at candidate cuts on a GPT-2 decode step's
matrices, and picks the fastest (`python -m minigpt tune`). A cut changes no exact bit
(minigpt.exact.tuning holds the cut and where it is kept).
"""

from __future__ import annotations

import time
from dataclasses import replace

import numpy as np

from ..gpt2.config import GPT2_VOCAB_SIZE, GPT2Config
from .fast import fast_linear
from .linear import exact_linear
from .threads import threads
from .tuning import MIB, NEVER, OPENBLAS_SPLIT, Tuning, cache_bytes, machine_default, tuned

SETTLE = 0.15  # seconds: longer than OpenBLAS's threads spin after a call (2**28 cycles), taking the CPUs


def fastest(candidates: dict, run, rounds: int = 5, settle: float = 0.0) -> tuple[object, dict]:
    """The candidate whose run(candidate) took least time, in interleaved rounds (a drifting machine
    slows all alike), and each one's best seconds; `settle`: seconds run untimed before each timing
    (OpenBLAS's threads still spin after the candidate before)."""
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


def measure(n_embd: int = GPT2Config.n_embd, vocab_size: int = GPT2_VOCAB_SIZE) -> tuple[Tuning, dict[str, dict]]:
    """Time the products at each candidate cut on a GPT-2 decode step's matrices (a block's four,
    as many as GPT-2 small's 12 weigh, and the LM head): the fastest cut, and the best seconds of
    every candidate (decision -> candidate -> seconds)."""
    rng = np.random.default_rng(0)
    C = n_embd
    shapes = ((C, 3 * C), (C, C), (C, 4 * C), (4 * C, C))  # [n_in, n_out], as a checkpoint stores them
    # as many blocks' matrices as twice L3 holds (at most GPT-2 small's 12): read from memory, as decode reads them
    n_blocks = min(12, -(-2 * (cache_bytes(3) or 32 * MIB) // (48 * C * C)))
    blocks = [rng.standard_normal(shape, dtype=np.float32) for _ in range(n_blocks) for shape in shapes]
    head = [rng.standard_normal((vocab_size, C), dtype=np.float32).T]  # wte.T, as lm_head passes it
    step = blocks * max(1, round(12 / n_blocks)) + head  # a decode step's weights, in their proportions
    choice = machine_default()
    l2 = (cache_bytes(2) or MIB) // 4  # weights that fill one core's L2

    def products(weights, rows: int, linear=exact_linear):
        x = [rng.standard_normal((rows, w.shape[0]), dtype=np.float32) for w in weights]

        def run(tuning: Tuning) -> None:
            with tuned(tuning):
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
    decide("blocks of the LM head for 1 row", "one_row_block", {f"{m} MiB": m * MIB // 4 for m in (2, 4, 8, 16, 32)},
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
    multi_row_blocks = {f"{size * 4 / MIB:.2f} MiB": size for size in sizes}
    decide("blocks for 2 rows (x 4) and 16 rows, split by OpenBLAS", "multi_row_block", multi_row_blocks, pair_and_batch)
    if threads() > 1:
        choice = replace(choice, shared_rows=1)
        decide("blocks for 16 rows, shared by minigpt's threads", "shared_block",
               {f"{share:.0%} of L2": int(l2 * share) for share in (1 / 8, 1 / 4, 2 / 5, 1 / 2, 3 / 4)},
               products(step, 16))
        choice = replace(choice, shared_rows=switch("exact kernels", "shared_rows",
                                                    ("blocks split by OpenBLAS", "shared blocks"), exact_linear,
                                                    rounds=3, settle=SETTLE))
        if choice.shared_rows <= 16:  # the batch takes shared blocks: OpenBLAS's split serves fewer rows alone
            decide("blocks for 2 rows, split by OpenBLAS", "multi_row_block", multi_row_blocks, few)
    choice = replace(choice, gemm_rows=switch("fast kernels", "gemm_rows", ("gemv per row", "one gemm"),
                                              fast_linear, rounds=3, settle=SETTLE))
    return choice, report
