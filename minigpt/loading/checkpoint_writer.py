"""Writing a GPT-2 checkpoint in every layout minigpt.loading.checkpoint reads (one file or shards,
prefixed names or not, float32/float16/bfloat16, with lm_head or the old mask buffers): the tests and
scripts/ make random checkpoints with it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .checkpoint import CONFIG_FILE, INDEX_FILE, LM_HEAD, PREFIX, WEIGHTS_FILE
from ..gpt2.config import GPT2Config
from ..gpt2.params import GPT2Params
from .safetensors_format import ENCODINGS, ITEMSIZE, atomic_write, write_safetensors
from .weights import params_to_tensors

HF_METADATA = {"format": "pt"}  # what save_pretrained puts in every safetensors header


def config_to_dict(config: GPT2Config) -> dict:
    """The config.json Hugging Face writes for this config (fields transformers needs to load it)."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "vocab_size": config.vocab_size,
        "n_positions": config.n_positions,
        "n_ctx": config.n_positions,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "bos_token_id": config.eos_token_id,
        "eos_token_id": config.eos_token_id,  # null when the vocabulary has no <|endoftext|>
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": True,
    }


def save_checkpoint(
    directory: str | os.PathLike,
    config: GPT2Config,
    params: GPT2Params,
    *,
    dtype: str = "float32",
    prefix: str = PREFIX,
    shards: int = 1,
    lm_head: bool = False,
    attn_bias: bool = False,
) -> None:
    """Write config.json and the weights in the layout Hugging Face uses: `prefix` "transformer." as
    save_pretrained names tensors, "" as the hub's file; shards > 1 with an index; lm_head and
    attn_bias also store lm_head.weight (= wte) and the hub's causal-mask buffers."""
    tensors = {prefix + name: value for name, value in params_to_tensors(params).items()}
    if lm_head:
        tensors[LM_HEAD] = params.wte
    if attn_bias:
        tensors.update(_mask_buffers(config, prefix))
    if not 1 <= shards <= len(tensors):  # before anything is written
        raise ValueError(f"shards must be in 1..{len(tensors)} (one tensor at least each), got {shards}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if shards == 1:
        write_safetensors(directory / WEIGHTS_FILE, tensors, dtype, HF_METADATA)
    else:
        _write_shards(directory, tensors, dtype, shards)
    _write_json(directory / CONFIG_FILE, config_to_dict(config))


def _mask_buffers(config: GPT2Config, prefix: str) -> dict[str, np.ndarray]:
    """The causal-mask buffers old transformers versions saved with every GPT-2 layer."""
    P = config.n_positions
    causal = np.tril(np.ones((1, 1, P, P), dtype=np.float32))
    buffers = {}
    for i in range(config.n_layer):
        buffers[f"{prefix}h.{i}.attn.bias"] = causal
        buffers[f"{prefix}h.{i}.attn.masked_bias"] = np.array(-1e4, dtype=np.float32)
    return buffers


def _write_shards(directory: Path, tensors: dict[str, np.ndarray], dtype: str, shards: int) -> None:
    """Split the sorted tensors into `shards` files of about equal count, then write the index."""
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        group = names[i * len(names) // shards:(i + 1) * len(names) // shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        write_safetensors(directory / file, {name: tensors[name] for name in group}, dtype, HF_METADATA)
        weight_map.update(dict.fromkeys(group, file))
    total_size = sum(np.size(value) for value in tensors.values()) * ITEMSIZE[ENCODINGS[dtype]]
    _write_json(directory / INDEX_FILE, {"metadata": {"total_size": total_size}, "weight_map": weight_map})


def _write_json(path: Path, content: object) -> None:
    """Write `content` as indented JSON with sorted keys, as Hugging Face does, atomically."""
    with atomic_write(path) as f:
        f.write((json.dumps(content, indent=2, sort_keys=True) + "\n").encode())
