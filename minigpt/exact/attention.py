"""The exact attention: each query row's output has the same bits whatever other rows are computed
with it and wherever its keys lie in memory (docs/exactness.md, point 4).

Query position t sees keys 0 .. L(t)-1, L(t) rounded up to a whole tile of TILE keys (keys after t
get weight +0.0); each key is scored by one dot product, each tile's TILE terms are summed in a fixed
order and the tiles by a fixed tree, and the softmax's sum divides once, at the end. Keys come in
one run or in runs of whole tiles, read in place when each head's rows follow each other, as the
caches store them (else copied into that layout). A run that ends at its tile's end is read whole, its
slots past the length zeros (the page pool keeps them so: minigpt.engine.paging); keys that end
inside a tile have that tile copied into a tile of zeros. A row's bits then depend on its position
and its data alone.
"""

from __future__ import annotations

import math
from functools import partial
from typing import NamedTuple, Sequence

import numpy as np

from .threads import threads, together, workers

TILE = 16  # keys per tile: the unit of every sum over keys
GROUP_ROW_TILES = 64  # query rows x tiles attended together: a decode batch of short sequences is one group
# The exact attention sums values times exponentials before it divides by their sum; taken this far
# below a row's maximum (each at most 2**-16), they keep that sum finite wherever the divided one
# is, for rows of up to 2**16 keys.
HEADROOM = np.float32(16 * math.log(2))

# A sequence's keys and values as runs of positions, in order: [(k, v), ...], each [H, n, hd]; every
# run but the last holds a whole number of tiles, and the last ends at the sequence's length or at
# the end of its tile.
Segments = Sequence[tuple[np.ndarray, np.ndarray]]


class BatchPart(NamedTuple):
    """One sequence's part of a batched attention call: its query rows (the last of its `length`
    positions), and its keys and values of positions 0 .. length-1 (perhaps on to the end of the
    last tile)."""

    rows: slice  # its rows in q [H, N, hd]
    length: int
    segments: Segments


class _Unit(NamedTuple):
    """Query rows of one sequence whose positions lie in one tile: they attend to the same keys."""

    rows: slice  # in q
    first: int  # the position of its first row
    n_tiles: int  # tiles attended: keys 0 .. TILE * n_tiles - 1
    runs: list[tuple[np.ndarray, np.ndarray]]  # those keys and values, in runs of whole tiles [H, TILE * p, hd]


def _whole_tiles(segments: Segments, S: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """A sequence's S keys and values as runs of whole tiles, laid out as the caches store them:
    [H, n, hd], each head's rows one after another. A gemv is then always over whole tiles (its bits
    for one key depend on how many it computes modulo four) and over rows at the same stride (with a
    head of fewer than four numbers, OpenBLAS's sums depend on it too).
    Keys laid out otherwise (the forward's, inside its qkv) are copied into that layout. Runs that
    end at a tile's end are taken as they are, their slots past S zeros (the page pool keeps them
    so); keys that end inside a tile have that tile, cut at S, copied into a tile of zeros. Either
    way a slot past S changes no bit."""
    runs, held = [], 0
    for k, v in segments:
        held += k.shape[1]
        runs.append((_rows(k), _rows(v)))
    k, v = runs.pop()
    n = k.shape[1] - (held - S)  # the last run's keys before S
    if held % TILE == 0:  # the last run to a tile's end: read whole, its slots past S zeros
        return [*runs, (k, v)]
    whole = n - S % TILE
    if whole:
        runs.append((k[:, :whole], v[:, :whole]))
    if S % TILE:
        pad = np.zeros((2, k.shape[0], TILE, k.shape[2]), np.float32)  # [k|v, H, TILE, hd]
        pad[0, :, :S % TILE], pad[1, :, :S % TILE] = k[:, whole:n], v[:, whole:n]
        runs.append((pad[0], pad[1]))
    return runs


def _laid_out(a: np.ndarray) -> bool:
    """Whether a [H, n, hd] holds each head's rows one after another, as the caches store keys."""
    return a.strides[1:] == (a.shape[2] * a.itemsize, a.itemsize)


def _rows(a: np.ndarray) -> np.ndarray:
    """a [H, n, hd] with each head's rows one after another: itself if it is so, else a copy."""
    return a if _laid_out(a) else np.ascontiguousarray(a)


def _cut(runs: list[tuple[np.ndarray, np.ndarray]], n: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The first n positions of runs, as views."""
    if n >= sum(k.shape[1] for k, _ in runs):
        return runs
    parts, taken = [], 0
    for k, v in runs:
        if taken >= n:
            break
        parts.append((k[:, :n - taken], v[:, :n - taken]))
        taken += parts[-1][0].shape[1]
    return parts


def _groups(parts: list[BatchPart]) -> list[list[_Unit]]:
    """Every sequence's query rows cut at tile edges into units, and consecutive units gathered into
    groups of at most GROUP_ROW_TILES rows x tiles (a unit alone may have more)."""
    groups: list[list[_Unit]] = [[]]
    rows = widest = 0  # the group's rows so far, and its widest unit's tiles
    for part in parts:
        runs, stop = _whole_tiles(part.segments, part.length), part.length
        start = stop - (part.rows.stop - part.rows.start)
        edges = [start, *range((start // TILE + 1) * TILE, stop, TILE), stop]
        to_row = part.rows.start - start  # position -> row of q
        for a, b in zip(edges, edges[1:]):
            n_tiles = a // TILE + 1
            unit = _Unit(slice(a + to_row, b + to_row), a, n_tiles, _cut(runs, TILE * n_tiles))
            if groups[-1] and (rows + b - a) * max(widest, n_tiles) > GROUP_ROW_TILES:
                groups.append([])
                rows = widest = 0
            groups[-1].append(unit)
            rows, widest = rows + b - a, max(widest, n_tiles)
    return groups


def _add_tiles(sums: np.ndarray) -> np.ndarray:
    """Sum over the first axis, [P, ...] -> [...], by a fixed tree over P2 tiles, P rounded up to a
    power of two: in place, the second half of the tiles added to the first until one is left.
    Tiles P .. P2-1 are taken as -0.0: those additions change nothing (x + -0.0 == x for every
    float x, -0.0 included), so they are not made. A row's own tiles past its last are -0.0 too,
    or +0.0 in sums of terms >= 0 (the softmax's). So each row's sum is the tree over its own
    tiles, padded to its own power of two, however many more the other rows of its group have."""
    n = sums.shape[0]
    half = 1 << (n - 1).bit_length()  # P2
    while half > 1:
        half //= 2
        pairs = n - half  # tiles i < pairs have a partner i + half that is held
        np.add(sums[:pairs], sums[half:n], out=sums[:pairs])
        n = half
    return sums[0]


def _attend(q: np.ndarray, units: list[_Unit]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact attention for one group of units, consecutive rows of q [H, N, hd]: their outputs
    [H, G, hd], and their weights [H, G, L] before and the sums [H, G, 1] they are divided by
    (G rows; L keys, the widest row's)."""
    n_head, _, head_dim = q.shape
    r0 = units[0].rows.start  # the group's rows of q: r0 .. r0 + G - 1
    G, P = units[-1].rows.stop - r0, max([u.n_tiles for u in units])
    L = TILE * P
    spans = [(u, u.rows.start - r0, u.rows.stop - r0) for u in units]  # unit, its rows a .. b-1

    # pass 1: scores. One gemv per query over each run of its keys, [m, hd] @ [hd] -> [m]: a key's
    # score is one dot product, the same whatever run or group it is computed in. Keys after a
    # row's position get -inf: weight exactly 0.0.
    scores = np.empty((n_head, G, L), np.float32)  # [H, G, L]
    for u, a, b in spans:
        key = 0
        for k, _ in u.runs:
            m = k.shape[1]
            np.matmul(k[:, None], q[:, u.rows, :, None], out=scores[:, a:b, key:key + m, None])  # [H, n, m, 1]
            key += m
        if b - a == 1:
            scores[:, a, u.first + 1:] = -np.inf
        else:
            future = np.arange(u.first + 1, L) > np.arange(u.first, u.first + b - a)[:, None]  # [b - a, keys]
            np.copyto(scores[:, a:b, u.first + 1:], -np.inf, where=future)

    # pass 2: scale, exponentiate (the softmax before its division), HEADROOM below the row's
    # maximum, which does not depend on order; each tile's TILE weights are summed in a fixed order,
    # beside its values.
    scores /= np.float32(math.sqrt(head_dim))
    scores -= np.maximum.reduce(scores, axis=-1, keepdims=True) + HEADROOM
    np.exp(scores, out=scores)  # [H, G, L]: the weights, before they are divided by their sum
    per_tile = np.empty((P, n_head, G, head_dim + 1), np.float32)  # [P, H, G, hd | the tile's sum]
    partials = per_tile.transpose(1, 2, 0, 3)  # [H, G, P, hd + 1] view
    np.add.reduce(scores.reshape(n_head, G, P, TILE), axis=-1, out=partials[..., head_dim])

    # pass 3: each tile's weighted sum of values, TILE keys at a time: [TILE] @ [TILE, hd] -> [hd].
    for u, a, b in spans:
        if u.n_tiles < P:
            partials[:, a:b, u.n_tiles:, :head_dim] = -0.0  # tiles past the unit's last add nothing
        tile = 0
        for _, v in u.runs:
            p = v.shape[1] // TILE
            w = scores[:, a:b, tile * TILE:(tile + p) * TILE].reshape(n_head, b - a, p, 1, TILE)
            np.matmul(w, v.reshape(n_head, 1, p, TILE, head_dim), out=partials[:, a:b, tile:tile + p, None, :head_dim])
            tile += p

    # pass 4: each query's tiles added up by a fixed tree, values and weights' sums alike; the
    # values divided by the sum once, at the end.
    total = _add_tiles(per_tile)  # [P, H, G, hd + 1] -> [H, G, hd + 1]
    sums = total[..., head_dim:]  # [H, G, 1]
    return total[..., :head_dim] / sums, scores, sums  # [H, G, hd]


def _each_group(q: np.ndarray, groups: list[list[_Unit]]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """_attend for every group, the groups dealt out in turn between minigpt's threads: a group's
    rows are its own, and its bits do not depend on the thread that computes it."""
    n_threads = min(threads(), len(groups)) if workers() is not None else 1

    def run(first: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return [_attend(q, units) for units in groups[first::n_threads]]
    if n_threads == 1:  # alone: no handing out
        return run(0)
    shares = together([partial(run, i) for i in range(n_threads)])
    return [shares[i % n_threads][i // n_threads] for i in range(len(groups))]


def exact_attend_batch(q: np.ndarray, parts: list[BatchPart]) -> np.ndarray:
    """Causal attention for several sequences' query rows at once, each row bitwise independent of
    every other row and of where its keys lie in memory: q [H, N, hd] -> [H, N, hd], the parts' rows
    following each other in q, in order."""
    return _attend_parts(q, parts)[0]


def _attend_parts(q: np.ndarray, parts: list[BatchPart], record: bool = False):
    """exact_attend_batch's output and, with `record`, each part's weights [H, T, S] (else Nones).
    Rows go in groups of up to GROUP_ROW_TILES rows x tiles (a decode batch of short
    sequences in one group; a long prefill, past its first tiles, one tile of positions per group),
    each group in four passes (`_attend`), the groups dealt between minigpt's threads."""
    q = np.ascontiguousarray(q)
    groups = _groups(parts)
    results = _each_group(q, groups)  # [([H, G, hd], [H, G, L], [H, G, 1]), ...]
    if len(groups) == 1:  # its rows are all of q's
        out = results[0][0]
    else:
        out = np.empty_like(q)  # [H, N, hd]
        for units, (values, _, _) in zip(groups, results):
            out[:, units[0].rows.start:units[-1].rows.stop] = values
    if not record:
        return out, [None] * len(parts)
    full = [np.zeros((q.shape[0], p.rows.stop - p.rows.start, p.length), np.float32) for p in parts]  # [H, T, S] each
    row_of = {}  # q row -> (part, its row in the part)
    for i, p in enumerate(parts):
        row_of.update({r: (i, r - p.rows.start) for r in range(p.rows.start, p.rows.stop)})
    for units, (_, scores, sums) in zip(groups, results):
        w, g = scores / sums, 0  # [H, G, L]: the weights
        for u in units:
            for r in range(u.rows.start, u.rows.stop):
                i, t = row_of[r]
                n_keys = min(w.shape[-1], full[i].shape[-1])
                full[i][:, t, :n_keys] = w[:, g, :n_keys]
                g += 1
    return out, full


def exact_attend(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """layers.attend's contract, exactly: q [H, T, hd], k and v [H, S, hd] -> [H, T, hd]."""
    S = k.shape[1]
    if q.shape[1] == 1:  # a decode step: its one unit, built here as _groups would, its keys read in place
        unit = _Unit(slice(0, 1), S - 1, -(-S // TILE), _whole_tiles([(k, v)], S))
        return _attend(np.ascontiguousarray(q), [unit])[0]
    return exact_attend_batch(q, [BatchPart(slice(0, q.shape[1]), S, [(k, v)])])


def exact_weights(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """The weights exact_attend gives, [H, T, S] (the values do not change them: k stands in)."""
    return _attend_parts(q, [BatchPart(slice(0, q.shape[1]), k.shape[1], [(k, k)])], record=True)[1][0]


