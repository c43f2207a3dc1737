"""Checkpoints and models the tests build: a tiny valid checkpoint, the broken ones that docs/loading.md's
rows name (each breaks a valid one and returns what the error message must name), and models with
weights chosen to overflow or to be uneven."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

import minigpt
from minigpt.errors import CheckpointError, ConfigError, UnsafeCheckpointError
from minigpt.gpt2.config import GPT2Config
from minigpt.loading.checkpoint_writer import save_checkpoint
from minigpt.loading.model import Model
from minigpt.loading.safetensors_format import read_safetensors, write_safetensors
from minigpt.loading.weights import params_from_tensors, params_to_tensors, random_params

# vocab_size 50257 so that GPT-2's tokenizer works with it; everything else as small as it gets.
TINY = GPT2Config(n_layer=1, n_embd=8, n_head=2, n_positions=32)
EOT = 50256
ALIASES = ("gpt2", "gpt2-medium", "distilgpt2", "random-124m")


def make_checkpoint(directory: Path, config: GPT2Config = TINY) -> Path:
    """A valid random checkpoint of `config` in `directory` (it uses the packaged tables, or MINIGPT_BPE_DIR's)."""
    save_checkpoint(directory, config, random_params(config, seed=1))
    return directory


# Broken checkpoints

def weights(directory: Path) -> Path:
    return directory / "model.safetensors"


def no_weights_file(directory):
    weights(directory).unlink()
    return [str(directory), "model.safetensors", "model.safetensors.index.json"]


def only_a_partial_download(directory):
    weights(directory).rename(directory / "model.safetensors.incomplete")
    return [str(directory), "model.safetensors"]


class RunsCode:
    """Unpickling this creates the directory `marker`: a harmless stand-in for arbitrary code."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)


def only_a_pickle(directory):
    weights(directory).unlink()
    (directory / "pytorch_model.bin").write_bytes(pickle.dumps(RunsCode(directory / "unpickled")))
    return ["pytorch_model.bin", "pickle", "safetensors"]


def replace_header(path: Path, header: bytes) -> None:
    """Overwrite a safetensors header with `header`, padded to the old length so the data stays put."""
    blob = path.read_bytes()
    length = int.from_bytes(blob[:8], "little")
    assert len(header) <= length
    path.write_bytes(blob[:8] + header.ljust(length) + blob[8 + length:])


def huge_header_length(directory):
    with open(weights(directory), "r+b") as f:
        f.write((2**40).to_bytes(8, "little"))
    return [str(weights(directory)), "header length"]


def garbage_header(directory):
    replace_header(weights(directory), b"\xff{not json")
    return [str(weights(directory)), "header", "JSON"]


def short_data(directory):
    blob = weights(directory).read_bytes()
    weights(directory).write_bytes(blob[:-100])
    return [str(weights(directory)), "truncated"]


def edit_tensors(directory: Path, edit) -> None:
    tensors = {name: np.array(value) for name, value in read_safetensors(weights(directory)).items()}  # writeable
    edit(tensors)
    write_safetensors(weights(directory), tensors)


def missing_tensor(directory):
    edit_tensors(directory, lambda t: t.pop("transformer.h.0.mlp.c_fc.bias"))
    return ["h.0.mlp.c_fc.bias"]


def wrong_shape(directory):
    edit_tensors(directory, lambda t: t.update({"transformer.h.0.attn.c_proj.weight": np.zeros((8, 4), np.float32)}))
    return ["h.0.attn.c_proj.weight", "[8, 4]", "[8, 8]"]


def wrong_dtype(directory):
    blob = weights(directory).read_bytes()
    header = json.loads(blob[8:8 + int.from_bytes(blob[:8], "little")])
    header["transformer.ln_f.bias"]["dtype"] = "I32"  # same size as F32: only the meaning changes
    replace_header(weights(directory), json.dumps(header, separators=(",", ":")).encode())
    return ["ln_f.bias", "I32", "float32"]


def non_finite(name: str, value: float):
    def poison(directory):
        def edit(tensors):
            tensors[f"transformer.{name}"].reshape(-1)[3] = value
        edit_tensors(directory, edit)
        return [name]
    poison.__name__ = f"{value}_in_{name}"
    return poison


def edit_config(directory: Path, **fields) -> None:
    """Set config.json fields; a field set to None is removed."""
    path = directory / "config.json"
    config = json.loads(path.read_text())
    config.update(fields)
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))


def config_without_n_head(directory):
    edit_config(directory, n_head=None)
    return ["n_head"]


def n_embd_not_divisible_by_n_head(directory):
    edit_config(directory, n_head=3)
    return ["n_embd", "n_head"]


def zero_layers(directory):
    edit_config(directory, n_layer=0)
    return ["n_layer"]


def negative_context(directory):
    edit_config(directory, n_positions=-32, n_ctx=-32)
    return ["n_positions"]


def config_not_json(directory):
    (directory / "config.json").write_text("{")
    return [str(directory / "config.json"), "JSON"]


def a_billion_layers(directory):
    """A config claiming sizes no file backs: refused before anything is built per layer."""
    edit_config(directory, n_layer=10**9)
    return ["n_layer 1000000000", "1 layer(s)"]


def fewer_layers_than_stored(directory):
    save_checkpoint(directory, dataclasses.replace(TINY, n_layer=2), random_params(dataclasses.replace(TINY, n_layer=2)))
    edit_config(directory, n_layer=1)
    return ["'h.1.attn.c_attn.bias'", "and 7 more", "n_layer 1"]


def a_key_twice_in_config(directory):
    text = (directory / "config.json").read_text()
    (directory / "config.json").write_text(text.replace('"n_layer": 1', '"n_layer": 1, "n_layer": 2'))
    return [str(directory / "config.json"), "'n_layer' appears twice"]


def bytes_after_the_last_tensor(directory):
    with open(weights(directory), "ab") as f:
        f.write(b"\0" * 8)
    return [str(weights(directory)), "8 bytes follow the last tensor"]


def weights_are_a_directory(directory):
    weights(directory).unlink()
    weights(directory).mkdir()
    return [f"{weights(directory)} is a directory"]


def config_is_a_fifo(directory):
    """Opening a FIFO blocks until something writes to it: it must be named, never opened."""
    (directory / "config.json").unlink()
    os.mkfifo(directory / "config.json")
    return [f"{directory / 'config.json'} is a FIFO"]


def weights_are_a_symlink_loop(directory):
    weights(directory).unlink()
    weights(directory).symlink_to(weights(directory).name)
    return [f"{weights(directory)} is a symlink loop"]


BROKEN_CHECKPOINTS = [
    pytest.param(no_weights_file, CheckpointError, id="no-weights-file"),
    pytest.param(only_a_partial_download, CheckpointError, id="only-model.safetensors.incomplete"),
    pytest.param(only_a_pickle, UnsafeCheckpointError, id="only-pytorch_model.bin"),
    pytest.param(huge_header_length, CheckpointError, id="bad-header-length"),
    pytest.param(garbage_header, CheckpointError, id="garbage-header"),
    pytest.param(short_data, CheckpointError, id="short-data"),
    pytest.param(missing_tensor, CheckpointError, id="missing-tensor"),
    pytest.param(wrong_shape, CheckpointError, id="wrong-shape"),
    pytest.param(wrong_dtype, CheckpointError, id="wrong-dtype"),
    pytest.param(non_finite("h.0.attn.c_attn.weight", math.nan), CheckpointError, id="nan-weight"),
    pytest.param(non_finite("wpe.weight", -math.inf), CheckpointError, id="inf-weight"),
    pytest.param(config_without_n_head, ConfigError, id="config-missing-field"),
    pytest.param(n_embd_not_divisible_by_n_head, ConfigError, id="config-n_embd-not-divisible"),
    pytest.param(zero_layers, ConfigError, id="config-zero-layers"),
    pytest.param(negative_context, ConfigError, id="config-negative-n_positions"),
    pytest.param(config_not_json, CheckpointError, id="config-not-json"),
    pytest.param(a_billion_layers, CheckpointError, id="config-n_layer-no-file-backs"),
    pytest.param(fewer_layers_than_stored, CheckpointError, id="config-fewer-layers-than-stored"),
    pytest.param(a_key_twice_in_config, CheckpointError, id="config-duplicate-key"),
    pytest.param(bytes_after_the_last_tensor, CheckpointError, id="trailing-bytes"),
    pytest.param(weights_are_a_directory, CheckpointError, id="weights-a-directory"),
    pytest.param(config_is_a_fifo, CheckpointError, id="config-a-fifo"),
    pytest.param(weights_are_a_symlink_loop, CheckpointError, id="weights-a-symlink-loop"),
]


class ReadError(Exception):
    """Like the HTTP client's error when a connection drops mid-file: not an OSError."""


def with_huge_position(model: minigpt.Model, position: int) -> minigpt.Model:
    """`model` whose position embedding at `position` is 3e38: only a sequence that reaches it overflows."""
    tensors = params_to_tensors(model.params)
    tensors["wpe.weight"] = tensors["wpe.weight"].copy()
    tensors["wpe.weight"][position] = 3e38
    return dataclasses.replace(model, params=params_from_tensors(model.config, tensors))




def tiny(vocab_size: int, seed: int) -> Model:
    config = GPT2Config(vocab_size=vocab_size, n_positions=32, n_embd=16, n_layer=2, n_head=2, eos_token_id=None)
    return Model(config, random_params(config, seed=seed, scale=30.0))  # sharp enough to be uneven
