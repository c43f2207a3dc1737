"""The exact kernels' numbers do not depend on the BLAS thread count: the same logits, batched
tokens and speculative tokens, bit for bit, at 1, 2, 3, 5 and 8 threads.

Each count runs in a fresh process. 1 and 2 come from OPENBLAS_NUM_THREADS, as a user sets them.
A machine with 3, 5 or 8 CPUs is pretended: the process is told it may run on that many CPUs
(os.sched_getaffinity, which both OpenBLAS and minigpt.exact.threads.threads consult) and OpenBLAS's
count is set through its own openblas_set_num_threads, so that its large products really are split
at those counts. One GPT-2-small-shaped layer and GPT-2's vocabulary: every matrix, the LM head's
50,257 outputs above all, is large enough for OpenBLAS to split between threads.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import ctypes, hashlib, os, sys
threads = int(sys.argv[1])
if sys.argv[2] == "pretend":
    os.sched_getaffinity = lambda pid: set(range(threads))  # before minigpt reads it
    import numpy  # loads OpenBLAS
    library = next(p for p in open("/proc/self/maps").read().split() if "openblas" in p and p.endswith(".so"))
    ctypes.CDLL(library).scipy_openblas_set_num_threads64_(threads)
import numpy as np
import minigpt
from minigpt.gpt2.config import GPT2Config
from minigpt.exact.threads import threads as minigpt_threads
from minigpt.loading.model import Model
from minigpt.loading.weights import random_params
assert minigpt_threads() == threads, (minigpt_threads(), threads)
config = GPT2Config(n_layer=1)
model = Model(config, random_params(config, seed=1))
ids = list(range(1000, 1110))
h = hashlib.sha256()
cache = model.new_cache()
h.update(model.forward(ids[:100], cache).tobytes())          # a prefill: attention groups shared by threads
for t in ids[100:]:
    h.update(model.forward([t], cache).tobytes())             # decode steps: one row
for r in minigpt.generate_batch(model, [ids[:5], ids[:17], ids[:9]], [6, 3, 5], temperature=[0, 1.0, 0.7],
                                seed=[None, 1, 2]):
    h.update(np.array(r.tokens + r.logprobs).tobytes())
r = minigpt.generate(model, ids[:12] * 2, 8, speculate="ngram")
h.update(np.array(r.tokens + r.logprobs).tobytes())
print(h.hexdigest())
"""

ROOT = Path(__file__).resolve().parents[2]


def digest(threads: int, how: str) -> str:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(threads), how], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def can_pretend() -> str | None:
    """Why the pretended thread counts cannot run here, or None."""
    if not Path("/proc/self/maps").exists() or not hasattr(os, "sched_getaffinity"):
        return "needs Linux's /proc/self/maps and sched_getaffinity"
    probe = "import numpy, sys; sys.exit(0 if any('scipy_openblas' in p for p in open('/proc/self/maps').read().split()) else 1)"
    if subprocess.run([sys.executable, "-c", probe]).returncode:
        return "NumPy's BLAS here is not its bundled scipy-openblas, whose openblas_set_num_threads the test calls"
    return None


def test_exact_results_are_bitwise_the_same_at_any_blas_thread_count():
    reference = digest(1, "environment")
    assert digest(2, "environment") == reference
    reason = can_pretend()
    if reason:
        pytest.skip(f"1 and 2 threads agree; 3, 5 and 8 not tried: {reason}")
    for threads in (3, 5, 8):
        assert digest(threads, "pretend") == reference, f"{threads} threads"
