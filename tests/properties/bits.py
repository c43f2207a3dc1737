"""The property tests' own oracle: arrays equal bit for bit, or the first difference named.

It shares no code with minigpt.exact.causal_proof's comparisons, which are part of what is tested (as
llm.c's test_gpt2.c checks with its own check_tensor). Bit patterns, not ==: == calls -0.0 and
+0.0 equal and a NaN unequal to itself.
"""

from __future__ import annotations

import numpy as np


def first_difference(a: np.ndarray, b: np.ndarray) -> str | None:
    """None when a and b have the same dtype, shape and bits; else a description of the first difference."""
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} != {b.dtype}"
    if a.shape != b.shape:
        return f"shape {a.shape} != {b.shape}"
    bits_a, bits_b = a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}")  # float32 -> uint32, ...
    differs = bits_a != bits_b
    if not differs.any():
        return None
    i = tuple(int(k) for k in np.argwhere(differs)[0])
    return (f"{int(differs.sum())} of {a.size} elements differ; the first at {i}: "
            f"{a[i].item()!r} (bits {int(bits_a[i]):#x}) != {b[i].item()!r} (bits {int(bits_b[i]):#x})")


def assert_same_bits(a: np.ndarray, b: np.ndarray, what: str = "arrays") -> None:
    difference = first_difference(a, b)
    assert difference is None, f"{what}: {difference}"


def assert_rows_same_bits(full: dict, part: dict, rows: slice) -> None:
    """Every array of the recorded forward `part` equals rows `rows` of the same array in `full`, bit for bit."""
    for key, array in part.items():
        assert_same_bits(full[key][rows], array, str(key))
