"""The bit oracle: two results equal bit for bit, or the first difference named.

It shares no code with causal_proof's comparisons, which it tests (as llm.c's check_tensor). Bit
patterns, not ==: == calls -0.0 and +0.0 equal and a NaN unequal to itself.
"""

from __future__ import annotations

import struct

import numpy as np

from ..loop.sequence import GenerationResult

# What a result is, as the exactness claims state it: not its timings nor the engine's counters
# (preemptions, cached tokens, drafts), which may differ between two runs of the same tokens. The
# prompt's scores are an engine's result's only (None on another).
RESULT_FIELDS = ("prompt_ids", "tokens", "text", "logprobs", "top_logprobs", "finish_reason", "prompt_logprobs",
                 "prompt_top_logprobs")


def first_difference(a: np.ndarray, b: np.ndarray) -> str | None:
    """None when a and b have the same dtype, shape and bits; else a description of the first
    difference: its row and element (for an array of rows), both values and their bit patterns."""
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} != {b.dtype}"
    if a.shape != b.shape:
        return f"shape {a.shape} != {b.shape}"
    bits_a, bits_b = a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}")  # float32 -> uint32, ...
    differs = bits_a != bits_b
    if not differs.any():
        return None
    i = tuple(int(k) for k in np.argwhere(differs)[0])
    where = {0: "the value", 1: f"element {i[0]}" if i else "", 2: f"row {i[0]}, element {i[1]}" if len(i) == 2 else ""}
    rows = f"; rows differing: {int(differs.reshape(a.shape[0], -1).any(axis=1).sum())} of {a.shape[0]}" if a.ndim >= 2 else ""
    return (f"{int(differs.sum())} of {a.size} elements differ{rows}; the first at {where.get(a.ndim) or f'index {i}'}: "
            f"{a[i].item()!r} (bits {int(bits_a[i]):#x}) != {b[i].item()!r} (bits {int(bits_b[i]):#x})")


def _scalar_bits(x: float) -> str:
    return f"{x!r} (bits {struct.unpack('<Q', struct.pack('<d', x))[0]:#x})"


def _difference(a: object, b: object, path: str) -> str | None:
    """The first difference between a and b, compared recursively, named by its path."""
    if isinstance(a, GenerationResult) and isinstance(b, GenerationResult):
        for name in RESULT_FIELDS:
            found = _difference(getattr(a, name, None), getattr(b, name, None), f"{path}.{name}")
            if found:
                return found
        return None
    if isinstance(a, (np.ndarray, np.generic)) or isinstance(b, (np.ndarray, np.generic)):
        a, b = np.asarray(a), np.asarray(b)
        found = first_difference(a, b)
        return found and f"{path}: {found}"
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        for i, (x, y) in enumerate(zip(a, b)):
            found = _difference(x, y, f"{path}[{i}]")
            if found:
                return found
        if len(a) != len(b):
            longer, extra = ("first", a) if len(a) > len(b) else ("second", b)
            return f"{path}: length {len(a)} != {len(b)}; the {longer} goes on with {extra[min(len(a), len(b))]!r}"
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return f"{path}: keys {sorted(a, key=repr)} != {sorted(b, key=repr)}"
        return next(filter(None, (_difference(a[k], b[k], f"{path}[{k!r}]") for k in a)), None)
    if isinstance(a, float) and isinstance(b, float):
        same = struct.pack("<d", a) == struct.pack("<d", b)
        return None if same else f"{path}: {_scalar_bits(a)} != {_scalar_bits(b)}"
    if type(a) is not type(b) and not (isinstance(a, int) and isinstance(b, int)):
        return f"{path}: {type(a).__name__} {a!r} != {type(b).__name__} {b!r}"
    return None if a == b else f"{path}: {a!r} != {b!r}"


def assert_bitwise(a: object, b: object, what: str = "value") -> None:
    """a and b are the same bits: arrays (dtype, shape, every element's bit pattern), lists, dicts
    and GenerationResults' content (not timings or counters), nested as they come; else an
    AssertionError naming the first difference, both values and their bit patterns."""
    found = _difference(a, b, what)
    if found:
        raise AssertionError(found)
