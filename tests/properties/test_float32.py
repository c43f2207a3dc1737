"""The forward is float32 end to end: no float64 scalar or array slips in anywhere (numpy 2
promotes float32 to float64 when one does, silently)."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from minigpt.testing.strategies import chunkings, models, token_ids

from minigpt.api.api import generate
from minigpt.exact.kernels import EXACT, FAST, BatchKernels
from minigpt.exact.tracing import traced_forward

F32 = np.dtype(np.float32)


def checking(kernels: BatchKernels, seen: list) -> BatchKernels:
    """The kernel set, recording the dtype of every array that enters or leaves its two functions:
    the outputs of every LayerNorm, GELU, head split and merge, linear layer and attention."""
    def linear(x, weight, bias):
        y = kernels.linear(x, weight, bias)
        seen.extend((x.dtype, weight.dtype, y.dtype) + (() if bias is None else (bias.dtype,)))
        return y

    def attend(q, k, v):
        out = kernels.attend(q, k, v)
        seen.extend((q.dtype, k.dtype, v.dtype, out.dtype))
        return out

    def weights(q, k):
        w = kernels.attention_weights(q, k)
        seen.extend((q.dtype, k.dtype, w.dtype))
        return w

    return dataclasses.replace(kernels, linear=linear, attend=attend, attention_weights=weights)


@given(st.data())
def test_every_intermediate_stays_float32_in_forward_cached_decode_and_generation(data):
    """Every array entering or leaving a kernel, every hidden state and attention weight in the
    trace, and the logits are float32 in a full forward, a chunked cached forward and a sampled
    generation, with either kernel set."""
    seen = []
    model = data.draw(models(checking(data.draw(st.sampled_from([EXACT, FAST]), label="kernels"), seen)))
    ids = data.draw(token_ids(model.config))
    cache, start = model.new_cache(), 0
    for size in data.draw(chunkings(len(ids)), label="chunks"):
        seen.append(model.forward(ids[start:start + size], cache).dtype)
        cache.length = start
        trace = traced_forward(model, ids[start:start + size], cache)
        seen.extend(a.dtype for a in [*trace.hidden, *trace.keys, *trace.values, *trace.weights, trace.logits])
        start += size
    generate(model, ids, model.config.n_positions - len(ids) + 1, temperature=0.7, seed=0)  # the whole context
    assert seen and set(seen) == {F32}, f"dtypes seen: {sorted(set(map(str, seen)))}"
