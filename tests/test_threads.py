"""The exact kernels' numbers do not depend on the BLAS thread count: the same logits, batched
tokens and speculative tokens, bit for bit, under OPENBLAS_NUM_THREADS=1 and 2 (each in a fresh
process, since OpenBLAS reads the variable once). GPT-2 small's shapes, so that the large products
(the LM head's 50,257 outputs) really are split between threads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import hashlib, numpy as np, minigpt
from minigpt.batching import generate_batch
model = minigpt.load("random-124m")
ids = list(range(1000, 1040))
h = hashlib.sha256()
cache = model.new_cache()
h.update(model.forward(ids[:30], cache).tobytes())           # a prefill: several rows
for t in ids[30:]:
    h.update(model.forward([t], cache).tobytes())             # decode steps: one row
for r in generate_batch(model, [ids[:5], ids[:17], ids[:9]], [6, 3, 5], temperature=[0, 1.0, 0.7], seed=[None, 1, 2]):
    h.update(np.array(r.tokens + r.logprobs).tobytes())
r = minigpt.generate(model, ids[:12] * 2, 8, speculate="ngram")
h.update(np.array(r.tokens + r.logprobs).tobytes())
print(h.hexdigest())
"""


def digest(threads: int) -> str:
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads)}
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=root, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_exact_results_are_bitwise_the_same_at_one_and_two_blas_threads():
    assert digest(1) == digest(2)
