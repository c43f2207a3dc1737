"""The pictures the commands' --plot draws (the `plot` extra, matplotlib without pyplot), each from
the data a command computed, into one image file."""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

import numpy as np

from ..errors import InputError, MinigptError
from ..exact.causal_proof import Proof
from ..exact.tracing import layer_names
from ..loop.staircase import Staircase


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


def staircase(found: Staircase, path: str | Path, title: str) -> None:
    """A plot of per-token latency against token index, both loops on one chart."""
    labels = {"naive": "naive loop", "cached": "KV cache"}
    plot_latencies({f"{labels[mode]}: total {sum(s):.2f} s": [t * 1e3 for t in s]
                    for mode, s in found.seconds.items()}, path, title)


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
    fig = figure(7, 4)
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
    save(fig, path, image)


MAX_INCHES = 20  # a picture's width and height at most: 2,000 pixels at 100 dpi, whatever it shows


def figure(width: float, height: float):
    """A matplotlib Figure of width x height inches (each at most MAX_INCHES), 100 dpi."""
    require_matplotlib()
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    return Figure(figsize=(min(width, MAX_INCHES), min(height, MAX_INCHES)), dpi=100, layout="constrained")


def save(fig, path: str | Path, image: str | None = None) -> None:
    """Write the figure to `path` whole or not at all: into a hidden file beside it, renamed over
    `path` once complete, so a failure midway (a full disk, a file-size limit, Ctrl-C) leaves no
    partial picture, and an earlier one at `path` stays as it was."""
    path = Path(path)
    image = image or image_format(path)
    part = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
    try:
        with open(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as file:
            fig.savefig(file, format=image)
        os.replace(part, path)
    except OSError as e:
        raise MinigptError(f"cannot write the picture to {path}: {e.strerror or e}") from None
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part)


def shown(token: str, width: int = 10) -> str:
    """A token's text for a label: whitespace made visible, long ones cut."""
    text = token.replace(" ", "\u00b7").replace("\n", "\u21b5").replace("\t", "\u21e5").replace("$", "\\$")
    return text if len(text) <= width else text[:width - 1] + "\u2026"


LABELLED_TOKENS = 48  # a single attention map names its tokens up to this many; beyond, it numbers positions
LENS_POSITIONS = 20  # the logit lens shows at most this many positions (the last): a cell holds a token's text


def attention(weights: np.ndarray, tokens: list[str], path: str | Path, title: str,
              layers: list[int], heads: list[int]) -> None:
    """A grid of heatmaps, one per (layer, head) asked for: weights [len(layers), len(heads), T, T],
    row t query t's weights over the keys, the future blank (exactly 0). A single map gets the tokens
    on its axes (their positions beyond LABELLED_TOKENS); the picture stays within MAX_INCHES a side."""
    one = len(layers) == len(heads) == 1
    size = min(1.6, (MAX_INCHES - 0.6) / max(len(layers), len(heads))) if not one else 0.35 * len(tokens) + 2
    fig = figure(max(4.0, size * len(heads) + 0.6), max(4.0, size * len(layers) + 0.6))
    grid = fig.subplots(len(layers), len(heads), squeeze=False)
    T = weights.shape[-1]
    future = np.triu(np.ones((T, T), bool), 1)
    for r, layer in enumerate(layers):
        for c, head in enumerate(heads):
            ax = grid[r, c]
            ax.imshow(np.ma.masked_array(weights[r, c], future), cmap="viridis", vmin=0, vmax=1)
            if one:
                if T <= LABELLED_TOKENS:
                    labels = [shown(t) for t in tokens]
                    ax.set_xticks(range(T), labels, rotation=90, fontsize=8)
                    ax.set_yticks(range(T), labels, fontsize=8)
                ax.set_xlabel("key (attended to)" + ("" if T <= LABELLED_TOKENS else ", its position"))
                ax.set_ylabel("query" + ("" if T <= LABELLED_TOKENS else ", its position"))
            else:
                ax.set_xticks([])
                ax.set_yticks([])
            if r == 0 or one:
                ax.set_title(f"head {head}" if not one else f"layer {layer}, head {head}", fontsize=8)
            if c == 0 and not one:
                ax.set_ylabel(f"layer {layer}", fontsize=8)
    fig.suptitle(title, fontsize=10, parse_math=False)
    save(fig, path)


def logit_lens(ids: np.ndarray, probs: np.ndarray, tokens: list[str], text_of, path: str | Path,
               title: str) -> None:
    """The logit lens as a table: a row per layer (the embeddings at the bottom, the model's own
    prediction at the top), a column per position (the last LENS_POSITIONS), each cell its most likely
    next token, coloured by that token's probability."""
    L, T = ids.shape[:2]
    first = max(0, T - LENS_POSITIONS)
    shown_ids, shown_probs = ids[:, first:], probs[:, first:]
    fig = figure(max(5.0, 0.9 * (T - first) + 2), 0.35 * L + 1.8)
    ax = fig.add_subplot()
    image = ax.imshow(shown_probs[:, :, 0], cmap="Blues", vmin=0, vmax=1, origin="lower", aspect="auto")
    for layer in range(L):
        for t in range(T - first):
            p = shown_probs[layer, t, 0]
            ax.text(t, layer, shown(text_of(int(shown_ids[layer, t, 0])), 8), ha="center", va="center", fontsize=7,
                    color="white" if p > 0.6 else "black")
    ax.set_xticks(range(T - first), [shown(t) for t in tokens[first:]], rotation=90, fontsize=8)
    ax.set_yticks(range(L), layer_names(L - 1)[:L], fontsize=8)
    where = f"positions {first} to {T - 1} of {T} " if first else "position "
    ax.set_xlabel(where + "(its token); each cell: the next token predicted from that layer")
    fig.colorbar(image, ax=ax, label="probability of the top token")
    ax.set_title(title, fontsize=10, parse_math=False)
    save(fig, path)


def proof(found: Proof, path: str | Path, title: str) -> None:
    """The proof at a glance: for each kernel set, a layer x step map of the largest difference between
    the cached and the naive forward (in ULPs at the layer's scale): zeros for exact kernels."""
    fig = figure(3.2 * len(found.drifts) + 1.2, 0.28 * len(found.drifts[0].grid) + 1.8)
    axes = fig.subplots(1, len(found.drifts), squeeze=False)[0]
    top = max(1.0, max(max(map(max, d.grid)) for d in found.drifts))
    names = [*layer_names(len(found.drifts[0].grid) - 3), "logits"]
    for ax, drift in zip(axes, found.drifts):
        image = ax.imshow(np.array(drift.grid), cmap="magma_r", vmin=0, vmax=top, origin="lower", aspect="auto")
        worst = max(map(max, drift.grid))
        ax.set_title(f"{drift.kernels} kernels: " + ("every bit equal" if worst == 0 else f"up to {worst:.3g} ULP"),
                     fontsize=9)
        ax.set_xticks(range(found.steps), range(found.steps), fontsize=7)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.set_xlabel("step")
    fig.colorbar(image, ax=list(axes), label="cached - naive, ULPs at the layer's scale")
    fig.suptitle(title, fontsize=10, parse_math=False)
    save(fig, path)


def pool(samples: list[dict], path: str | Path, title: str) -> None:
    """The page pool over a run, one sample of Engine.stats() per step: pages held by running
    sequences, kept by the prefix cache and free, stacked; each step that preempted or evicted marked."""
    fig = figure(9, 3.6)
    ax = fig.add_subplot()
    steps = range(1, len(samples) + 1)
    series = [[s["pages_in_use"] for s in samples], [s["pages_cached"] for s in samples],
              [s["pages_free"] for s in samples]]
    ax.stackplot(steps, *series, labels=["in use (running sequences)", "cached (prefix cache, nobody holds)", "free"],
                 colors=["tab:blue", "tab:orange", "0.85"])
    for key, marker, label in (("preemptions", "v", "preemption"), ("evictions", "x", "eviction")):
        marked = [i + 1 for i in range(len(samples)) if samples[i][key] > (samples[i - 1][key] if i else 0)]
        if marked:
            ax.plot(marked, [samples[0]["pages_total"]] * len(marked), marker, color="black", linestyle="none",
                    label=label, clip_on=False)
    ax.set_xlabel("engine step")
    ax.set_ylabel("pages")
    ax.set_ylim(0, samples[0]["pages_total"] if samples else 1)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title(title, fontsize=10, parse_math=False)
    save(fig, path)
