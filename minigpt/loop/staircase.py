"""The cost staircase, measured: the wall time of every generated token, naive loop vs KV cache.

Both loops are minigpt.loop.loops' (`naive_steps`, `cached_steps`, each step timed by its Sequence) on the
same prompt, greedy and never stopping at <|endoftext|>, so both do exactly N steps. Without the cache step n reruns all
P + n positions and its time climbs; with it every step after the prefill does the same work.
`minigpt.loop.cost` gives the predicted ratio next to the measured one; docs/staircase.md explains
why they differ.

Source: Inference Engineering (fanout.sh, inference-eng), "The Autoregressive Loop & Cost": the cost staircase.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from .cost import Cost, estimate, gpt2_architecture
from ..errors import InputError, MinigptError, check_int
from .loops import cached_steps, naive_steps
from ..gpt2.forward import GPT2
from .sampling import SamplingOptions
from .sequence import Request, Sequence, context_error, positions_needed

OnStep = Callable[[str, int, float], None]  # (mode, tokens so far, that token's seconds)
MODES = ("naive", "cached")


@dataclass(frozen=True)
class Staircase:
    """Per-token seconds of both loops (token 1 includes the prompt's forward) and the arithmetic."""

    seconds: dict[str, list[float]]  # mode ("naive" or "cached") -> N wall times
    predicted: Cost  # for this model's shapes, P and N

    def summary(self, mode: str) -> dict[str, float]:
        """first, last and median per-token milliseconds, and the total in seconds."""
        s = self.seconds[mode]
        return {"first_ms": s[0] * 1e3, "last_ms": s[-1] * 1e3, "median_ms": statistics.median(s) * 1e3,
                "total_s": sum(s)}

    @property
    def measured_ratio(self) -> float:
        return sum(self.seconds["naive"]) / sum(self.seconds["cached"])


def fixed_prompt(gpt: GPT2, n_tokens: int) -> list[int]:
    """n_tokens arbitrary but reproducible token ids (the cost does not depend on which)."""
    return np.random.default_rng(0).integers(gpt.config.vocab_size, size=n_tokens).tolist()


def measure(gpt: GPT2, prompt_tokens: int, new_tokens: int, on_step: OnStep | None = None) -> Staircase:
    """Time both loops on the same prompt; a short warm-up first so that token 1 is not a cold start.
    The sizes are checked before any work: a request too long for the context fails at once."""
    prompt_tokens, new_tokens = check_int(prompt_tokens, "prompt_tokens", 1), check_int(new_tokens, "new_tokens", 1)
    if positions_needed(prompt_tokens, new_tokens) > gpt.config.n_positions:
        raise context_error(gpt.config.n_positions, prompt_tokens, new_tokens, "prompt_tokens")
    prompt = fixed_prompt(gpt, prompt_tokens)
    timed(gpt, prompt[:1], 1, "cached")  # the first BLAS calls, every weight's pages touched once
    seconds = {mode: timed(gpt, prompt, new_tokens, mode, on_step) for mode in MODES}
    predicted = estimate(gpt2_architecture("model", gpt.config), prompt_tokens, new_tokens)
    return Staircase(seconds, predicted)


def timed(gpt: GPT2, prompt: list[int], new_tokens: int, mode: str, on_step: OnStep | None = None) -> list[float]:
    """The seconds of each of new_tokens greedy steps of one loop, never stopping at <|endoftext|>."""
    seq = Sequence(Request(tuple(prompt), new_tokens, SamplingOptions(), eos_token_id=None))
    for _ in (cached_steps if mode == "cached" else naive_steps)(gpt, seq):
        if on_step is not None:
            on_step(mode, len(seq.tokens), seq.seconds[-1])
    return seq.seconds


def require_matplotlib() -> None:
    """Fail early, before a long measurement, when the plot cannot be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise MinigptError("--plot needs matplotlib: pip install 'minigpt[plot]' (or pip install matplotlib)") from None


def image_format(path: str | Path) -> str:
    """The format a plot of `path` is written in: its extension's (png, svg, pdf, ... whatever matplotlib
    writes), PNG when it has none; the file is `path` exactly, nothing appended. Asked of matplotlib's
    canvas without drawing anything, so that a bad name fails before a long measurement."""
    require_matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase  # no pyplot: no GUI backend

    extension = Path(path).suffix[1:].lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if extension and extension not in formats:
        raise InputError(f"matplotlib cannot write a .{extension} file; name a file ending in "
                         + ", ".join(f".{f}" for f in sorted(formats)) + " (no extension: PNG)")
    return extension or "png"


def plot(staircase: Staircase, path: str | Path, title: str) -> None:
    """A plot of per-token latency against token index, both loops on one chart."""
    labels = {"naive": "naive loop", "cached": "KV cache"}
    plot_latencies({f"{labels[mode]}: total {sum(s):.2f} s": [t * 1e3 for t in s]
                    for mode, s in staircase.seconds.items()}, path, title)


def plot_latencies(series: dict[str, list[float]], path: str | Path, title: str, *, first_token: int = 1,
                   floor: tuple[str, float] | None = None) -> None:
    """A plot of milliseconds per generated token, one line per labelled series starting at `first_token`,
    and optionally a (label, ms) floor as a dashed line. scripts/benchmark.py draws its plot with it too."""
    plot_lines({label: (range(first_token, first_token + len(ms)), ms) for label, ms in series.items()}, path,
               title, xlabel="generated token", ylabel="wall time of that token (ms)", floor=floor)


def plot_lines(series: dict[str, tuple[list[float], list[float]]], path: str | Path, title: str, *,
               xlabel: str, ylabel: str, floor: tuple[str, float] | None = None) -> None:
    """A plot of one line per labelled (x values, y values) series, y from 0, and optionally a (label, y)
    floor as a dashed line, written to `path` exactly (format: image_format). The latency plots use it,
    and scripts/benchmark.py's tokens/s against B."""
    image = image_format(path)
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    fig = Figure(figsize=(7, 4), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    for label, (x, y) in series.items():
        ax.plot(x, y, "o-", markersize=2, linewidth=1, label=label)
    if floor is not None:
        label, y = floor
        ax.axhline(y, color="black", linestyle="--", linewidth=1, label=label)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    # the title holds a model path: "$" in it is text, not mathtext
    ax.set_title(title, fontsize=10, parse_math=False)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    try:
        fig.savefig(path, format=image)
    except OSError as e:
        raise MinigptError(f"cannot write the plot to {path}: {e.strerror or e}") from None
