"""Hypothesis strategies: small random GPT-2s, in memory or written as Hugging Face checkpoints,
token ids, prompts, and requests' options drawn from their one declaration (minigpt.requests.request),
constraints included.

Weights come at several scales, from all zero to saturated softmax and GELU; sequences cross the
exact attention kernel's tiles (a page each in the pool).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from hypothesis import strategies as st

from ..gpt2.config import GPT2_VOCAB_SIZE, GPT2Config
from ..gpt2.params import GPT2Params
from ..exact.causal_proof import record_forward
from ..exact.kernels import EXACT, BatchKernels
from ..loading.checkpoint_writer import save_checkpoint
from ..loading.model import Model
from ..requests.request import MAX_BIAS, MAX_PENALTY, OPTIONS
from ..loading.safetensors_format import ENCODINGS
from ..loading.tokenizer import gpt2_tokenizer
from ..loading.weights import expected_shapes, params_from_tensors, random_params
from ..loop.sampling import MAX_TOP_LOGPROBS
from ..engine.paging import PAGE, pages_for

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
def gpt2_vocab_models(draw, kernels: BatchKernels = EXACT, scales=SCALES, min_positions: int = 8) -> Model:
    """A random GPT-2 of 1-2 layers and 1-16 embedding dimensions with GPT-2's 50,257 tokens and its
    tokenizer (the packaged tables): what stop strings and constraints need."""
    n_head, head_dim = draw(st.integers(1, 2)), draw(st.integers(1, 8))
    config = GPT2Config(vocab_size=GPT2_VOCAB_SIZE, n_positions=draw(st.integers(min_positions, 48)),
                        n_embd=n_head * head_dim, n_layer=draw(st.integers(1, 2)), n_head=n_head,
                        eos_token_id=GPT2_VOCAB_SIZE - 1)
    scale = draw(st.sampled_from(scales))
    params = zero_params(config) if scale == 0 else random_params(config, draw(st.integers(0, 2**32 - 1)), scale)
    return Model(config, params, kernels, tokenizer_loader=shared_tokenizer)


shared_tokenizer = functools.cache(gpt2_tokenizer)  # built once, for every model drawn


LAYOUTS = {  # save_checkpoint's keywords for each layout the hub uses
    "save_pretrained": {}, "hub naming": {"prefix": ""}, "lm_head stored": {"lm_head": True},
    "mask buffers": {"attn_bias": True}, "hub file": {"prefix": "", "lm_head": True, "attn_bias": True},
}


@dataclass(frozen=True)
class Checkpoint:
    """A random model and how to store it: `write(directory)` writes it there in Hugging Face's layout."""

    config: GPT2Config
    params: GPT2Params
    layout: dict
    shards: int
    dtype: str

    def write(self, directory) -> Path:
        save_checkpoint(directory, self.config, self.params, shards=self.shards, dtype=self.dtype, **self.layout)
        return Path(directory)


@st.composite
def checkpoints(draw, scales=SCALES[1:]) -> Checkpoint:
    """A random small GPT-2 as a Hugging Face checkpoint: a layout the hub uses, 1-3 shards, float32,
    float16 or bfloat16 storage (the loaded weights are then the stored values, decoded)."""
    config = draw(configs())
    params = random_params(config, draw(st.integers(0, 2**32 - 1)), draw(st.sampled_from(scales)))
    return Checkpoint(config, params, LAYOUTS[draw(st.sampled_from(sorted(LAYOUTS)), label="layout")],
                      draw(st.integers(1, 3), label="shards"), draw(st.sampled_from(sorted(ENCODINGS)), label="dtype"))


@st.composite
def token_ids(draw, config: GPT2Config, min_size: int = 1, max_size: int | None = None) -> list[int]:
    """Token ids; the length is drawn first, so that long sequences (past PAGE) come often."""
    size = draw(st.integers(min_size, config.n_positions if max_size is None else max_size), label="length")
    return draw(st.lists(st.integers(0, config.vocab_size - 1), min_size=size, max_size=size), label="ids")


@st.composite
def prompts(draw, config, largest: int, seen: list[list[int]]) -> list[int]:
    """A prompt of at most `largest` ids: new, or cut from a sequence seen (a prompt, or one with its
    generated tokens, whose pages are cached) at a page boundary or anywhere, whole, or extended."""
    kind = draw(st.sampled_from(["new", "prefix", "whole", "extended"] if seen else ["new"]), label="prompt")
    def length(most: int) -> st.SearchStrategy[int]:  # any, or whole pages
        return st.integers(1, most) | st.integers(1, max(most // PAGE, 1)).map(lambda n: min(n * PAGE, most))
    if kind == "new":
        n = draw(length(largest), label="length")
        return draw(token_ids(config, min_size=n, max_size=n), label="ids")
    base = draw(st.sampled_from(seen), label="base")[:largest]
    if kind == "whole":
        return base
    cut = draw(length(len(base)), label="cut")
    tail = [] if kind == "prefix" else draw(token_ids(config, 0, largest - cut), label="tail")
    return base[:cut] + tail


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
    bias = st.one_of(st.sampled_from([-float(MAX_BIAS), float(MAX_BIAS)]), st.floats(-MAX_BIAS, MAX_BIAS))
    return draw(st.fixed_dictionaries({}, optional={
        "logit_bias": st.dictionaries(st.integers(0, vocab_size - 1), bias, max_size=4),
        "presence_penalty": st.floats(-MAX_PENALTY, MAX_PENALTY), "frequency_penalty": st.floats(-MAX_PENALTY, MAX_PENALTY),
        "repetition_penalty": st.floats(0.1, 4), "min_tokens": st.integers(0, max_new_tokens)}), label="controls")


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 99},
                                          "ok": {"type": "boolean"}}, "required": ["n", "ok"], "additionalProperties": False}
CONSTRAINTS = [  # (keyword, value, a check of a text that matched whole)
    ("regex", "[0-9]{1,4}( [a-z]+)?", lambda text: re.fullmatch("[0-9]{1,4}( [a-z]+)?", text)),
    ("regex", "(ab|cd)+", lambda text: re.fullmatch("(ab|cd)+", text)),
    ("regex", "-?[0-9]{1,3}", lambda text: re.fullmatch("-?[0-9]{1,3}", text)),
    ("choice", ["yes", "no", "not sure"], lambda text: text in ("yes", "no", "not sure")),
    ("json_schema", SCHEMA, lambda text: text == json.dumps(json.loads(text)) and set(json.loads(text)) == {"n", "ok"}),
    ("grammar", 'start: "(" item ("," item)* ")"\nitem: /[a-c]+/ | start', lambda text: text.startswith("(")),
    ("grammar", 'start: ("a" | "b") start', lambda text: False),  # never matched whole: always "length"
]
constraints = st.sampled_from(CONSTRAINTS).map(lambda c: {c[0]: c[1]})  # needs llguidance and GPT-2's vocabulary
stops = st.lists(st.text(st.sampled_from("ab .\n\u00e9"), min_size=1, max_size=3), min_size=1, max_size=3)  # stop strings


def knows_text(model: Model) -> bool:
    """The model has GPT-2's tokenizer: stop strings and constraints can be asked of it."""
    return getattr(model, "tokenizer_loader", None) is not None and model.config.vocab_size == GPT2_VOCAB_SIZE


@st.composite
def options(draw, model: Model, max_new_tokens: int, constrained: bool = False) -> dict:
    """Some of a request's batched options, each within its declared bounds: every one but
    max_new_tokens (the caller's), stop strings with a text model and at most one constraint when
    `constrained` (llguidance installed)."""
    drawn = {**draw(sampling, label="sampling"), **draw(controls(model.config.vocab_size, max_new_tokens))}
    drawn.update(draw(st.fixed_dictionaries({}, optional={
        "stop_at_eos": st.booleans(), "top_logprobs": st.integers(0, MAX_TOP_LOGPROBS),
        **({"stop": stops} if knows_text(model) else {})}), label="options"))
    if constrained and knows_text(model) and draw(st.booleans(), label="constrained"):
        drawn.update(draw(constraints, label="constraint"))
    return drawn


DRAWN = {"temperature", "seed", "top_k", "top_p", "logit_bias", "presence_penalty", "frequency_penalty",
         "repetition_penalty", "min_tokens", "stop_at_eos", "top_logprobs", "stop", "regex", "json_schema", "choice",
         "grammar"}  # what `options` may draw: every batched option but max_new_tokens (a test holds it to OPTIONS)


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
