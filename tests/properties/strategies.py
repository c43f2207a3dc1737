"""Hypothesis strategies for the property tests: small random GPT-2s, their weights, token ids,
and requests' options (sampling, and the logits processing of `controls`).

Configurations: 1-3 layers, 1-4 heads, head_dim 1-16, vocabularies of 2-64 tokens, n_positions
up to 64 (so that sequences cross the exact attention kernel's PAGE of 16). Weights come at
several scales: all zero (every tensor, LayerNorm gains included), Hugging Face's initialisation
(std 0.02), 30x that (sharp attention), and 1000x (std 20: saturated softmax and GELU).
"""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from minigpt.exact.causal_proof import record_forward
from minigpt.gpt2.config import GPT2Config
from minigpt.exact.attention import PAGE
from minigpt.exact.kernels import EXACT, BatchKernels
from minigpt.engine.paging import pages_for
from minigpt.loading.model import Model
from minigpt.gpt2.params import GPT2Params
from minigpt.loading.options import OPTIONS
from minigpt.loading.weights import expected_shapes, params_from_tensors, random_params

SCALES = (0.0, 1.0, 30.0, 1000.0)  # 0.0 stands for the all-zero model


@st.composite
def configs(draw, min_positions: int = 1) -> GPT2Config:
    n_head, head_dim = draw(st.integers(1, 4)), draw(st.integers(1, 16))
    vocab_size = draw(st.integers(2, 64))
    return GPT2Config(vocab_size=vocab_size, n_positions=draw(st.integers(min_positions, 64)),
                      n_embd=n_head * head_dim, n_layer=draw(st.integers(1, 3)), n_head=n_head,
                      eos_token_id=draw(st.none() | st.integers(0, vocab_size - 1)))


def zero_params(config: GPT2Config) -> GPT2Params:
    return params_from_tensors(config, {name: np.zeros(shape, np.float32)
                                        for name, shape in expected_shapes(config).items()})


@st.composite
def models(draw, kernels: BatchKernels = EXACT, scales=SCALES, min_positions: int = 1) -> Model:
    """A random small GPT-2 with weights at one of `scales` (no tokenizer: ids only)."""
    config = draw(configs(min_positions))
    scale = draw(st.sampled_from(scales))
    seed = draw(st.integers(0, 2**32 - 1))
    params = zero_params(config) if scale == 0 else random_params(config, seed, scale)
    return Model(config, params, kernels)


@st.composite
def token_ids(draw, config: GPT2Config, min_size: int = 1, max_size: int | None = None) -> list[int]:
    """Token ids; the length is drawn first, so that long sequences (past PAGE) come often."""
    size = draw(st.integers(min_size, config.n_positions if max_size is None else max_size), label="length")
    return draw(st.lists(st.integers(0, config.vocab_size - 1), min_size=size, max_size=size), label="ids")


@st.composite
def chunkings(draw, length: int) -> list[int]:
    """Chunk sizes summing to `length`: a prefill cut anywhere into chunks, then single-token steps."""
    prefill = draw(st.integers(1, length))
    cuts = sorted(draw(st.sets(st.integers(1, prefill - 1)))) if prefill > 1 else []
    return np.diff([0, *cuts, prefill]).tolist() + [1] * (length - prefill)


def chunked_record(model: Model, ids: list[int], chunks: list[int], capacity: int) -> dict:
    """record_forward over ids fed chunk by chunk into one cache, the chunks' rows concatenated."""
    cache, parts, start = model.new_cache(capacity), [], 0
    for size in chunks:
        parts.append(record_forward(model, ids[start:start + size], cache))
        start += size
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}


sampling = st.one_of(
    st.just({"temperature": 0.0, "seed": None, "top_k": None, "top_p": None}),  # greedy
    st.fixed_dictionaries({"temperature": st.floats(0.05, 3.0), "seed": st.integers(0, 2**32 - 1),
                           "top_k": st.none() | st.integers(1, 64), "top_p": st.none() | st.floats(0.05, 1.0)}),
)


@st.composite
def controls(draw, vocab_size: int, max_new_tokens: int) -> dict:
    """A request's logits processing (minigpt.loop.processing): none, or some of logit_bias (its
    bounds included), the presence, frequency and repetition penalties and min_tokens."""
    if draw(st.booleans(), label="no controls"):
        return {}
    bias = st.one_of(st.sampled_from([-100.0, 100.0]), st.floats(-100, 100))
    return draw(st.fixed_dictionaries({}, optional={
        "logit_bias": st.dictionaries(st.integers(0, vocab_size - 1), bias, max_size=4),
        "presence_penalty": st.floats(-2, 2), "frequency_penalty": st.floats(-2, 2),
        "repetition_penalty": st.floats(0.1, 4), "min_tokens": st.integers(0, max_new_tokens)}), label="controls")


@st.composite
def batches(draw, kernels: BatchKernels = EXACT, scales=SCALES):
    """A random model and 1-6 requests of random lengths and options (sampling and controls), with
    max_batch_size and a pool size from the smallest that fits the largest request to ample."""
    model = draw(models(kernels, scales, min_positions=2))
    n = draw(st.integers(1, 6), label="prompts")
    prompts, lengths, options = [], [], []
    for _ in range(n):
        ids = draw(token_ids(model.config, max_size=model.config.n_positions))
        prompts.append(ids)
        lengths.append(draw(st.integers(0, model.config.n_positions - len(ids) + 1), label="max_new_tokens"))
        options.append({**draw(sampling, label="sampling"), **draw(controls(model.config.vocab_size, lengths[-1]))})
    largest = max(pages_for(len(p) + max(m, 1) - 1) for p, m in zip(prompts, lengths))
    pool_pages = draw(st.integers(largest, largest * n + 1), label="pool pages")
    return model, prompts, lengths, options, draw(st.integers(1, n + 1), label="max_batch_size"), pool_pages * PAGE


def per_prompt(options: list[dict]) -> dict:
    """Per-request option dicts as one dict of per-prompt lists (generate_batch's form), an option
    a request leaves out at its default."""
    return {key: [o.get(key, OPTIONS[key].default) for o in options] for key in {k for o in options for k in o}}
