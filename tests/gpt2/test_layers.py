"""Each layer against an independent float64 reference, with stated float32 tolerances (llm.c style).

The reference is written here directly from the GPT-2 definitions in float64; when torch is
installed, torch's own functions are a second reference. Tolerances are relative to the output's
scale: float32 has a 6e-8 unit roundoff, and these ops accumulate at most a few thousand terms.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from minigpt.exact.attention import TILE, BatchPart
from minigpt.exact.kernels import EXACT, FAST
from minigpt.gpt2.layers import gelu, layer_norm, merge_heads, split_heads
from minigpt.gpt2.params import LayerNorm

RTOL = 1e-5  # of the output scale, for elementwise ops and row reductions


def rel_err(a: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(a.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_layer_norm_matches_float64_reference(rng):
    x = rng.standard_normal((7, 96), dtype=np.float32) * 3 + 1
    p = LayerNorm(rng.standard_normal(96, dtype=np.float32), rng.standard_normal(96, dtype=np.float32))
    y = layer_norm(x, p, 1e-5)
    x64 = x.astype(np.float64)
    ref = (x64 - x64.mean(-1, keepdims=True)) / np.sqrt(x64.var(-1, keepdims=True) + 1e-5) * p.weight + p.bias
    assert y.dtype == np.float32
    assert rel_err(y, ref) < RTOL


def test_gelu_matches_float64_tanh_reference(rng):
    x = np.linspace(-12, 12, 4001, dtype=np.float32)
    x64 = x.astype(np.float64)
    ref = 0.5 * x64 * (1 + np.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64**3)))
    y = gelu(x)
    assert y.dtype == np.float32
    assert np.abs(y - ref).max() < 1e-5 * 12


def test_split_and_merge_heads_are_inverse_and_group_columns_by_head(rng):
    x = rng.standard_normal((5, 12), dtype=np.float32)
    heads = split_heads(x, 3)  # [5, 12] -> [3, 5, 4]
    assert heads.shape == (3, 5, 4)
    np.testing.assert_array_equal(heads[1], x[:, 4:8])
    np.testing.assert_array_equal(merge_heads(heads), x)


@pytest.mark.parametrize("kernels", [EXACT, FAST], ids=lambda k: k.name)
@pytest.mark.parametrize("T", [1, 9])
@pytest.mark.parametrize("n_out", [40, 64, 200, 1000])  # a tail only, whole ALIGN calls, both, several blocks
@pytest.mark.parametrize("layout", ["stored", "head"])  # [n_in, n_out] as a checkpoint's; wte.T, a view
def test_linear_matches_float64_reference(kernels, T, n_out, layout, rng):
    x = rng.standard_normal((T, 256), dtype=np.float32)
    w = rng.standard_normal((256, n_out), dtype=np.float32) if layout == "stored" else \
        rng.standard_normal((n_out, 256), dtype=np.float32).T
    b = rng.standard_normal(n_out, dtype=np.float32)
    y = kernels.linear(x, w, b)
    assert y.dtype == np.float32 and y.shape == (T, n_out)
    assert rel_err(y, x.astype(np.float64) @ w + b) < 1e-6 * 16


@pytest.mark.parametrize("layout", ["stored", "head"])
@pytest.mark.parametrize("T", [1, 9])
def test_exact_linear_reads_the_weights_in_place_without_a_copy(layout, T, rng):
    import tracemalloc
    from minigpt.exact.linear import exact_linear
    x = rng.standard_normal((T, 1024), dtype=np.float32)
    w = rng.standard_normal((1024, 20000), dtype=np.float32) if layout == "stored" else \
        rng.standard_normal((20000, 1024), dtype=np.float32).T  # 82 MB either way
    tracemalloc.start()
    try:
        exact_linear(x, w, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < w.nbytes / 10, peak  # the output, its temporaries, a tail: no copy of the weights


def test_exact_linear_on_few_inputs_and_many_outputs_is_bitwise_the_same_in_one_block_or_many(rng):
    """OpenBLAS's SkylakeX gemv "N" runs calls of at most 16,384 outputs on at most 48 inputs through a
    kernel of its own: a block past that would round its outputs otherwise (docs/exactness.md)."""
    from minigpt.exact.linear import exact_linear
    from minigpt.exact.tuning import Tuning, tuned
    x = rng.standard_normal((2, 40), dtype=np.float32)
    w = rng.standard_normal((40, 40960), dtype=np.float32)  # 20,480 outputs a thread at 2 threads
    whole, small = (Tuning(blocks, blocks, blocks, 10**9, 10**9) for blocks in (10**9, 40 * 1024))
    with tuned(whole):
        a = exact_linear(x, w, None)
    with tuned(small):
        b = exact_linear(x, w, None)
    np.testing.assert_array_equal(a.view(np.uint32), b.view(np.uint32))


def reference_attention(q, k, v):
    """Causal softmax attention in float64 for queries at positions L-T .. L-1 over keys 0 .. L-1."""
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    T, L = q.shape[1], k.shape[1]
    scores = q @ k.transpose(0, 2, 1) / math.sqrt(q.shape[-1])
    scores[:, np.arange(L)[None, :] > np.arange(L - T, L)[:, None]] = -np.inf
    w = np.exp(scores - scores.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return w @ v, w


@pytest.mark.parametrize("kernels", [EXACT, FAST], ids=lambda k: k.name)
@pytest.mark.parametrize("start, T", [(0, 1), (0, 37), (20, 1), (13, 19), (0, 300), (40, 150)])  # > QUERY_BLOCK
def test_attention_matches_float64_reference(kernels, start, T, rng):
    H, hd, capacity = 3, 8, 512
    k_buf = np.zeros((H, capacity, hd), np.float32)
    v_buf = np.zeros((H, capacity, hd), np.float32)
    L = start + T
    k_buf[:, :L] = rng.standard_normal((H, L, hd), dtype=np.float32)
    v_buf[:, :L] = rng.standard_normal((H, L, hd), dtype=np.float32)
    q = rng.standard_normal((H, T, hd), dtype=np.float32)
    out, weights = kernels.attend(q, k_buf[:, :L], v_buf[:, :L]), kernels.attention_weights(q, k_buf[:, :L])
    ref_out, ref_w = reference_attention(q, k_buf[:, :L], v_buf[:, :L])
    assert out.dtype == np.float32 and weights.dtype == np.float32
    assert weights.shape == (H, T, L)
    assert rel_err(out, ref_out) < 1e-5
    assert np.abs(weights - ref_w).max() < 1e-6
    future = np.arange(L)[None, :] > np.arange(start, L)[:, None]
    assert np.all(weights[:, future] == 0.0)


@pytest.mark.parametrize("kernels", [EXACT, FAST], ids=lambda k: k.name)
@pytest.mark.parametrize("S", [16, 17, 1024])
def test_attention_of_values_near_the_float32_limit_stays_finite(kernels, S):
    """Equal scores and every value 3e38: the output is 3e38. The exact kernel divides by the
    softmax's sum last, so its undivided sums must keep that headroom (they would reach S x 3e38)."""
    q, k = np.zeros((2, 1, 4), np.float32), np.zeros((2, S, 4), np.float32)
    v = np.full((2, S, 4), 3e38, np.float32)
    with np.errstate(over="raise", invalid="raise"):
        out = kernels.attend(q, k, v)
    np.testing.assert_allclose(out, 3e38, rtol=1e-5)


def test_layers_match_torch_where_installed(rng):
    torch = pytest.importorskip("torch", reason="torch (the `parity` extra) is the second reference")
    x = rng.standard_normal((6, 32), dtype=np.float32)
    g, b = rng.standard_normal(32, dtype=np.float32), rng.standard_normal(32, dtype=np.float32)
    ref_ln = torch.nn.functional.layer_norm(torch.from_numpy(x), (32,), torch.from_numpy(g), torch.from_numpy(b), 1e-5)
    assert rel_err(layer_norm(x, LayerNorm(g, b), 1e-5), ref_ln.double().numpy()) < RTOL
    ref_gelu = torch.nn.functional.gelu(torch.from_numpy(x), approximate="tanh")
    assert rel_err(gelu(x), ref_gelu.double().numpy()) < RTOL


@pytest.mark.parametrize("kernels", [EXACT, FAST], ids=lambda k: k.name)
def test_attention_over_pages_scattered_in_runs_equals_one_contiguous_run(kernels, rng):
    """The same keys and values cut into runs of pages (a paged cache) give the same attention:
    bit for bit with the exact kernels, within rounding with the fast ones."""
    H, hd, T = 2, 8, 36
    k = rng.standard_normal((H, 57, hd), dtype=np.float32)
    v = rng.standard_normal((H, 57, hd), dtype=np.float32)
    q = rng.standard_normal((H, T, hd), dtype=np.float32)
    whole = kernels.attend(q, k, v)
    cuts = [0, 16, 48, 57]  # runs of 1, 2 and part of 1 pages, each its own array
    runs = [(k[:, a:b].copy(), v[:, a:b].copy()) for a, b in zip(cuts, cuts[1:])]
    # the same, the last page whole, as a cache holds it: zeros past the length
    last_page = tuple(np.concatenate([a, np.zeros((H, 7, hd), np.float32)], axis=1) for a in runs[-1])
    for segments in (runs, runs[:-1] + [last_page]):
        paged = kernels.attend_batch(q, [BatchPart(slice(0, T), 57, segments)])
        if kernels is EXACT:
            np.testing.assert_array_equal(paged.view(np.uint32), whole.view(np.uint32))
        else:
            assert rel_err(paged, whole) < 1e-6


def test_exact_attention_of_a_sequence_is_bitwise_the_same_beside_longer_ones(rng):
    """A decode row attends over its own tiles; beside sequences with more tiles (whose extra tiles
    pad its sums in a shared array) its output is bit for bit what it is alone, signed zeros
    included (its values here are all -0.0)."""
    H, hd = 4, 16
    short_k = rng.standard_normal((H, 16, hd), dtype=np.float32)
    short_v = np.full((H, 16, hd), -0.0, np.float32)
    long_k = rng.standard_normal((H, 320, hd), dtype=np.float32)  # 20 tiles: sums over 8 or more
    long_v = rng.standard_normal((H, 320, hd), dtype=np.float32)  # tiles reassociate if pads count
    q = rng.standard_normal((H, 3, hd), dtype=np.float32)
    alone = EXACT.attend(q[:, :1], short_k[:, :10], short_v[:, :10])
    parts = [BatchPart(slice(0, 1), 10, [(short_k[:, :10], short_v[:, :10])]),
             BatchPart(slice(1, 2), 311, [(long_k[:, :311], long_v[:, :311])]),
             BatchPart(slice(2, 3), 141, [(long_k[:, :141], long_v[:, :141])])]
    together = EXACT.attend_batch(q, parts)
    np.testing.assert_array_equal(together[:, :1].view(np.uint32), alone.view(np.uint32))
    for i, p in enumerate(parts[1:], 1):
        single = EXACT.attend(q[:, i:i + 1], *p.segments[0])
        np.testing.assert_array_equal(together[:, i:i + 1].view(np.uint32), single.view(np.uint32))


def test_exact_attention_of_any_tile_count_is_bitwise_the_same_beside_any_longer_row(rng):
    """Each row's sum over tiles is the tree over its own tiles padded to its own power of two: a
    row of n tiles gives the same bits beside a row of m >= n tiles, for every n <= m <= 12 (a tree
    that halved the group's tile count instead would pair a row's tiles by the longest row's)."""
    H, hd = 2, 8
    k = rng.standard_normal((H, 12 * TILE, hd), dtype=np.float32)
    v = rng.standard_normal((H, 12 * TILE, hd), dtype=np.float32)
    q = rng.standard_normal((H, 2, hd), dtype=np.float32)
    for n in range(1, 13):
        alone = EXACT.attend(q[:, :1], k[:, :n * TILE], v[:, :n * TILE])
        for m in range(n, 13):
            parts = [BatchPart(slice(0, 1), n * TILE, [(k[:, :n * TILE], v[:, :n * TILE])]),
                     BatchPart(slice(1, 2), m * TILE, [(k[:, :m * TILE], v[:, :m * TILE])])]
            together = EXACT.attend_batch(q, parts)
            np.testing.assert_array_equal(together[:, :1].view(np.uint32), alone.view(np.uint32), f"{n} beside {m}")


@pytest.mark.parametrize("kernels", [EXACT, FAST], ids=lambda k: k.name)
def test_attention_over_a_cache_s_keys_in_place_is_bitwise_over_them_copied_whatever_follows(kernels, rng):
    """A KVCache hands attention views of its store cut at the length, whatever its slots past the
    length hold (NaN here): the exact kernels read whole tiles in place and copy a tile the length
    ends inside into a tile of zeros, so the bits are those of the keys copied out. The fast kernels
    hand BLAS heads that lie apart, and BLAS promises no bits across layouts: the same values
    within rounding."""
    H, hd = 2, 8
    q = rng.standard_normal((H, 1, hd), dtype=np.float32)
    for capacity, S in ((64, 21), (64, 32), (23, 21), (21, 21)):
        k = rng.standard_normal((H, capacity, hd), dtype=np.float32)  # as a cache stores it
        v = rng.standard_normal((H, capacity, hd), dtype=np.float32)
        k[:, S:], v[:, S:] = np.nan, np.nan
        alone = kernels.attend(q, k[:, :S].copy(), v[:, :S].copy())
        in_place = kernels.attend(q, k[:, :S], v[:, :S])
        if kernels is FAST:
            np.testing.assert_allclose(in_place, alone, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(in_place.view(np.uint32), alone.view(np.uint32))


@pytest.mark.parametrize("head_dim", [1, 2, 3, 64])
def test_exact_attention_is_bitwise_the_same_whatever_the_layout_of_its_keys(head_dim, rng):
    """Keys and values inside a forward's qkv matrix (rows 3C apart), contiguous, or as a cache
    stores them (each head's rows one after another, the heads a capacity apart, zeros after the
    length): the exact kernel gives the same bits from each, also for heads of fewer than four
    numbers, whose sums in OpenBLAS depend on the distance between rows."""
    H, S, T = 3, 37, 5
    C = H * head_dim
    qkv = rng.standard_normal((S, 3 * C), dtype=np.float32)
    q, k, v = (split_heads(qkv[:, i * C:(i + 1) * C], H) for i in range(3))  # [H, S, hd], rows 3C apart
    stored = np.zeros((2, H, 48, head_dim), np.float32)  # [k|v, H, capacity, hd]
    stored[0, :, :S], stored[1, :, :S] = k, v
    layouts = {"qkv": (k, v), "head by head": (k.copy(), v.copy()),
               "stored": (stored[0, :, :S], stored[1, :, :S])}
    got = {name: EXACT.attend(q[:, -T:], k_, v_) for name, (k_, v_) in layouts.items()}
    whole = [(stored[0], stored[1])]  # a pool's pages, read whole
    got["stored, whole pages"] = EXACT.attend_batch(q[:, -T:], [BatchPart(slice(0, T), S, whole)])
    for name, out in got.items():
        np.testing.assert_array_equal(out.view(np.uint32), got["stored"].view(np.uint32), err_msg=name)
