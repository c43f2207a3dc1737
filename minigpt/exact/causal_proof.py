"""The causal-mask proof: why a KV cache can be exact, run as an experiment, bit for bit.

`prove` runs the naive and the cached loop side by side and checks on the bits every claim of
docs/exactness.md's argument: old positions never change, masked weights are +0.0, unseen tokens
reach no earlier position, and the cached loop computes the naive loop's numbers. It returns the
verdicts as data; `python -m minigpt prove` prints them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..gpt2.config import GPT2Config
from ..loop.cost import token_counts
from ..gpt2.forward import GPT2, forward
from .kernels import FAST
from ..cache.kv_cache import KVCache, forward_cached, new_cache
from ..gpt2.layers import merge_heads
from ..loop.sequence import check_finite
from .tracing import Trace, layer_names, traced_forward

# The four checks, numbered 1 to 4 in docs/exactness.md, and the verdict columns of a Row: the three
# quantities of check 1, then checks 2 to 4.
CHECKS = ("unchanged", "masked", "causal", "cached")
COLUMNS = ("hidden", "K", "V", "masked", "causal", "cached")

# ------------------------------------------------------------------------ comparing bit patterns


def ordered_bits(a: np.ndarray) -> np.ndarray:
    """float32 bit patterns as int64, in the order of the values they encode (+0.0 and -0.0 both 0):
    a difference is a distance in ULPs."""
    i = a.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)  # sign-magnitude -> two's complement


@dataclass(frozen=True)
class Comparison:
    """One comparison of two [positions, width] float32 arrays, bit pattern against bit pattern.

    step: the generation step (for the "causal" check: the tokens from position P + step on were changed).
    position: the first position whose bits differ, or None when every bit is the same.
    """

    check: str  # "unchanged", "masked", "causal" or "cached"
    step: int
    layer: str  # "embeddings", "block i", "ln_f" or "logits"
    quantity: str  # "hidden", "K", "V", "weights" or "logits"
    position: int | None
    max_ulp: int  # the largest distance between bit patterns (huge near 0.0, where ULPs are tiny)
    max_abs: float
    scale_ulp: float  # max_abs in ULPs of b's largest magnitude: the drift at the layer's scale

    @property
    def column(self) -> str:
        return self.quantity if self.check == "unchanged" else self.check


def compare(check: str, step: int, layer: str, quantity: str, a: np.ndarray, b: np.ndarray,
            first_position: int = 0) -> Comparison:
    """Compare a and b ([T, width] float32, row i = position first_position + i) bit for bit."""
    if a.dtype != np.float32 or b.dtype != np.float32:
        raise TypeError(f"bit comparisons need float32 arrays, got {a.dtype} and {b.dtype}")
    differs = (a.view(np.uint32) != b.view(np.uint32)).any(axis=1)  # [T]
    position = first_position + int(np.argmax(differs)) if differs.any() else None
    ulps = np.abs(ordered_bits(a) - ordered_bits(b))
    max_abs = float(np.abs(a - b).max(initial=0.0))
    ulp_at_scale = float(np.spacing(np.abs(b).max(initial=np.float32(0.0))))
    return Comparison(check, step, layer, quantity, position, int(ulps.max(initial=0)), max_abs,
                      max_abs / ulp_at_scale)


# ------------------------------------------------------------- what one forward computed


def snapshot(config: GPT2Config, trace: Trace) -> dict[tuple[str, str], np.ndarray]:
    """(layer, quantity) -> [T, width] for the T positions a traced forward computed, in the order it
    computed them: embeddings, then per block its K, V and output, then ln_f."""
    names = layer_names(config.n_layer)
    snap = {(names[0], "hidden"): trace.hidden[0]}
    for i, hidden in enumerate(trace.hidden[1:-1]):
        snap[(names[i + 1], "K")] = trace.keys[i]
        snap[(names[i + 1], "V")] = trace.values[i]
        snap[(names[i + 1], "hidden")] = hidden
    snap[(names[-1], "hidden")] = trace.hidden[-1]
    return snap


def record_forward(gpt: GPT2, ids, cache: KVCache | None = None) -> dict[tuple[str, str], np.ndarray]:
    """One traced forward (cache-free unless given a cache): its snapshot plus ("logits", "logits")."""
    trace = traced_forward(gpt, ids, cache)
    return {**snapshot(gpt.config, trace), ("logits", "logits"): trace.logits}


def compare_snapshots(check: str, step: int, a: dict, b: dict, rows: slice) -> list[Comparison]:
    """Compare positions `rows` of every array in snapshot a with b, which holds just those positions."""
    return [compare(check, step, layer, quantity, a[layer, quantity][rows], b[layer, quantity], rows.start)
            for layer, quantity in b]


# ------------------------------------------------------------------------------- the checks


@dataclass(frozen=True)
class Work:
    """Tokens pushed through the model by the two loops (minigpt.loop.cost.token_counts): naive
    P*N + N(N-1)/2, cached P + N - 1. Each of the naive loop's extra naive - cached positions is one
    it had computed already at an earlier step."""

    naive: int
    cached: int
    repeated_share: float  # (naive - cached) / naive: the naive loop's work that was pure repetition


def work_of(prompt_len: int, n_steps: int) -> Work:
    """The two loops' Work for a prompt of prompt_len tokens and n_steps new ones, by cost's count."""
    naive, cached = token_counts(prompt_len, n_steps)
    return Work(naive, cached, 1 - cached / naive)


@dataclass(frozen=True)
class Findings:
    """What checks 1 to 4 found with one kernel set."""

    comparisons: tuple[Comparison, ...]  # in the order run
    tokens: tuple[int, ...]  # the naive loop's tokens
    tokens_equal: bool  # the cached loop chose the same token at every step


def old_positions_unchanged(step: int, now: dict, before: dict | None) -> list[Comparison]:
    """Check 1: the naive loop's snapshot `now` holds, at the positions of the step `before`, the same bits."""
    if before is None:
        return []
    n_before = before["embeddings", "hidden"].shape[0]
    return compare_snapshots("unchanged", step, now, before, slice(0, n_before))


def masked_weights(config: GPT2Config, step: int, trace: Trace, start: int) -> list[Comparison]:
    """Check 2: each layer's attention weights on future keys (key > query) against exact +0.0."""
    comparisons = []
    for name, weights in zip(layer_names(config.n_layer)[1:-1], trace.weights):  # [H, T, start + T]
        _, T, S = weights.shape
        future = np.arange(S) > (start + np.arange(T))[:, None]  # [T, S]
        on_future = merge_heads(np.where(future, weights, np.float32(0.0)))  # [H, T, S] -> [T, H*S]
        comparisons.append(compare("masked", step, name, "weights", on_future, np.zeros_like(on_future), start))
    return comparisons


def cached_equals_naive(config: GPT2Config, step: int, naive_now: dict, cached: Trace, start: int,
                        logits: list[np.ndarray]) -> list[Comparison]:
    """Check 4: the positions the cached loop computed at this step against the naive loop's, and the
    last logits row of the two forwards, [naive, cached, traced naive, traced cached], against each other."""
    new = slice(start, start + cached.hidden[0].shape[0])
    rows = [row[None] for row in logits]  # [1, vocab] each
    return [*compare_snapshots("cached", step, naive_now, snapshot(config, cached), new),
            *(compare("cached", step, "logits", "logits", rows[0], row, new.stop - 1) for row in rows[1:])]


def check_loops(gpt: GPT2, prompt: list[int], n_steps: int) -> Findings:
    """Checks 1, 2 and 4: run the naive and the cached loop side by side, step by step, greedily, each
    forward twice: as itself and traced."""
    config = gpt.config
    cache, traced_cache = (new_cache(config, len(prompt) + n_steps - 1) for _ in range(2))
    naive_ids, cached_ids = list(prompt), list(prompt)
    comparisons, tokens, tokens_equal = [], [], True
    before = None  # the naive loop's snapshot at the step before
    for step in range(n_steps):
        start = cache.length
        logits = [forward(gpt, naive_ids, logits_to_keep=1)[0],
                  forward_cached(gpt, cached_ids[start:], cache, logits_to_keep=1)[0]]
        for row in logits:
            check_finite(row)
        naive = traced_forward(gpt, naive_ids, logits_to_keep=1)
        cached = traced_forward(gpt, cached_ids[start:], traced_cache, logits_to_keep=1)
        now = snapshot(config, naive)  # every position so far
        comparisons += old_positions_unchanged(step, now, before)
        comparisons += masked_weights(config, step, naive, 0) + masked_weights(config, step, cached, start)
        if tokens_equal:  # after a different token the two loops continue different sequences
            comparisons += cached_equals_naive(config, step, now, cached, start,
                                               logits + [naive.logits[0], cached.logits[0]])
        naive_token, cached_token = (int(np.argmax(row)) for row in logits)
        tokens_equal = tokens_equal and naive_token == cached_token
        naive_ids.append(naive_token)
        cached_ids.append(cached_token)
        tokens.append(naive_token)
        before = now
    return Findings(tuple(comparisons), tuple(tokens), tokens_equal)


def check_causality(gpt: GPT2, prompt: list[int], tokens: tuple[int, ...]) -> list[Comparison]:
    """Check 3 on prompt + tokens: for each step s, replace every token from position n = P + s on
    with another, drawn at random (seed 0), and compare every position before n (none with a
    vocabulary of one token)."""
    config, rng = gpt.config, np.random.default_rng(0)
    if config.vocab_size < 2:
        return []

    ids = np.asarray([*prompt, *tokens])
    reference = record_forward(gpt, ids)
    comparisons = []
    for step, n in enumerate(range(len(prompt), len(ids))):
        changed = ids.copy()
        changed[n:] = (ids[n:] + rng.integers(1, config.vocab_size, len(ids) - n)) % config.vocab_size
        before_n = {key: a[:n] for key, a in reference.items()}
        comparisons += compare_snapshots("causal", step, record_forward(gpt, changed), before_n, slice(0, n))
    return comparisons


def check_all(gpt: GPT2, prompt: list[int], n_steps: int) -> Findings:
    """Checks 1 to 4 with the model's kernels."""
    loops = check_loops(gpt, prompt, n_steps)
    causal = check_causality(gpt, prompt, loops.tokens)  # 3
    return dataclasses.replace(loops, comparisons=loops.comparisons + tuple(causal))


# ------------------------------------------------------------------------------- the result


@dataclass(frozen=True)
class Row:
    """One layer's verdicts: column -> True (bitwise as claimed), False, or None (not applicable)."""

    layer: str
    verdicts: dict[str, bool | None]
    scale_ulp: float  # the largest difference in any of its comparisons, in ULPs at the layer's scale


def rows_of(config: GPT2Config, comparisons: tuple[Comparison, ...]) -> tuple[Row, ...]:
    rows = []
    for layer in [*layer_names(config.n_layer), "logits"]:
        mine = [c for c in comparisons if c.layer == layer]
        verdicts = dict.fromkeys(COLUMNS)
        for c in mine:
            verdicts[c.column] = verdicts[c.column] is not False and c.position is None
        rows.append(Row(layer, verdicts, max((c.scale_ulp for c in mine), default=0.0)))
    return tuple(rows)


@dataclass(frozen=True)
class Drift:
    """Where a kernel set's bits moved where the argument says nothing may, and how far."""

    kernels: str
    first: dict[str, Comparison | None]  # check -> its first differing comparison in the order run
    max_ulp: int
    max_abs: float
    scale_ulp: float
    tokens_equal: bool
    grid: tuple[tuple[float, ...], ...]  # [layer, then logits][step]: cached vs naive hidden states, ULPs at scale


def drift_of(kernels: str, findings: Findings, n_layer: int, n_steps: int) -> Drift:
    first = {check: next((c for c in findings.comparisons if c.check == check and c.position is not None), None)
             for check in CHECKS}

    def largest(field: str):
        return max((getattr(c, field) for c in findings.comparisons), default=0)

    cached = {}
    for c in findings.comparisons:
        if c.check == "cached" and c.quantity in ("hidden", "logits"):
            cached[c.layer, c.step] = max(cached.get((c.layer, c.step), 0.0), c.scale_ulp)
    grid = tuple(tuple(cached.get((layer, step), 0.0) for step in range(n_steps))
                 for layer in [*layer_names(n_layer), "logits"])
    return Drift(kernels, first, largest("max_ulp"), largest("max_abs"), largest("scale_ulp"), findings.tokens_equal,
                 grid)


@dataclass(frozen=True)
class Proof:
    """Every check of the argument on one model, prompt and number of steps."""

    kernels: str
    prompt_len: int
    steps: int
    tokens: tuple[int, ...]  # the naive loop's greedy tokens
    rows: tuple[Row, ...]
    work: Work
    drifts: tuple[Drift, ...]  # the kernels checked, then (if they were not fast) the fast kernels

    @property
    def holds(self) -> bool:
        """True when every applicable check held bit for bit and the two loops chose the same tokens."""
        verdicts = [v for row in self.rows for v in row.verdicts.values() if v is not None]
        return all(verdicts) and self.drifts[0].tokens_equal


def prove(gpt: GPT2, prompt: list[int], n_steps: int = 8) -> Proof:
    """Run every check with the model's kernels and, for contrast, measure the fast kernels' drift.
    The prompt (checked ids) and the steps fit the context; n_steps >= 2 (checks compare consecutive steps)."""
    findings = check_all(gpt, prompt, n_steps)
    n_layer = gpt.config.n_layer
    drifts = [drift_of(gpt.kernels.name, findings, n_layer, n_steps)]
    if gpt.kernels is not FAST:
        fast = check_all(dataclasses.replace(gpt, kernels=FAST), prompt, n_steps)
        drifts.append(drift_of(FAST.name, fast, n_layer, n_steps))
    return Proof(gpt.kernels.name, len(prompt), n_steps, findings.tokens, rows_of(gpt.config, findings.comparisons),
                 work_of(len(prompt), n_steps), tuple(drifts))
