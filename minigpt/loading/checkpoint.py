"""GPT-2 checkpoints in the Hugging Face layout: a local directory in, config and weights out.

The weights are one model.safetensors or its shards, tensor names with or without `transformer.`.
Every tensor is checked (presence, shape, float dtype, finiteness) before any computing, so a bad
checkpoint fails here, naming the file and the tensor; pickle is refused unopened (docs/loading.md).
minigpt.loading.checkpoint_writer writes every layout read here.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .checks import SIZE_FIELDS, check_config
from ..gpt2.config import GPT2Config
from ..errors import CheckpointError, ConfigError, UnsafeCheckpointError, unique_keys
from .files import is_file, kind, list_directory
from ..gpt2.params import GPT2Params
from .weights import BLOCK_TENSORS, expected_shapes, params_from_tensors
from .safetensors_format import (
    TensorInfo, read_header, read_safetensors,
)

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
PREFIX = "transformer."  # GPT2LMHeadModel's name for the GPT2Model inside it
LM_HEAD = "lm_head.weight"
MASK_BUFFERS = ("attn.bias", "attn.masked_bias")  # per layer, in files of old transformers versions: not weights


# Activations that are GPT-2's tanh-approximated GELU under their Hugging Face names.
TANH_GELU_NAMES = ("gelu_new", "gelu_pytorch_tanh")


def config_from_dict(d: object, source: str = "config.json") -> GPT2Config:
    """Read a Hugging Face GPT-2 config.json (already parsed); reject fields that change the math."""
    if not isinstance(d, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(d).__name__}")
    model_type = d.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise ConfigError(f"{source}: field 'model_type' is {model_type!r}; minigpt runs GPT-2 ('gpt2') only")
    activation = d.get("activation_function", "gelu_new")
    if activation not in TANH_GELU_NAMES:
        raise ConfigError(
            f"{source}: field 'activation_function' is {activation!r}; GPT-2 uses {TANH_GELU_NAMES[0]!r}"
        )
    n_inner, n_embd = d.get("n_inner"), d.get("n_embd")
    if n_inner is not None and not (isinstance(n_embd, int) and n_inner == 4 * n_embd):
        raise ConfigError(f"{source}: field 'n_inner' is {n_inner!r}; GPT-2's MLP is 4 * n_embd wide (null)")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if d.get(flag):
            raise ConfigError(f"{source}: field {flag!r} is set; minigpt implements the original GPT-2 only")
    if d.get("scale_attn_weights") is False:
        raise ConfigError(f"{source}: field 'scale_attn_weights' is false; GPT-2 scales by 1/sqrt(head_dim)")
    fields = {}
    for field in dataclasses.fields(GPT2Config):
        key = field.name
        if key == "n_positions" and key not in d and "n_ctx" in d:
            key = "n_ctx"  # the oldest GPT-2 configs call it n_ctx
        if key in d:
            fields[field.name] = d[key]
        elif field.name in SIZE_FIELDS:
            raise ConfigError(f"{source}: missing field {field.name!r}")
    eos, vocab = fields.get("eos_token_id"), fields.get("vocab_size")
    if isinstance(eos, int) and isinstance(vocab, int) and eos >= vocab:
        fields["eos_token_id"] = None  # transformers' default 50256 in a smaller test vocabulary: no such token
    try:
        return check_config(GPT2Config(**fields))
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


@dataclass(frozen=True)
class _StoredTensor:
    """Where a tensor lives: its file, its name in that file (maybe prefixed) and its header entry."""

    path: Path
    name: str
    info: TensorInfo


def load_checkpoint(directory: str | os.PathLike) -> tuple[GPT2Config, GPT2Params]:
    """Read a GPT-2 checkpoint directory in Hugging Face layout; every weight checked, float32."""
    directory = Path(directory)
    files = _weight_files(directory)
    config = _read_config(directory)
    return config, params_from_tensors(config, _read_weights(config, files))


def _weight_files(directory: Path) -> list[Path]:
    """The safetensors file(s) holding the weights, by their exact names only (a partial download
    is never mistaken for them); pickle checkpoints are refused unopened."""
    what = kind(directory, CheckpointError)
    if what != "a directory":
        raise CheckpointError(f"{directory}: not a directory ({what or 'nothing is there'})")
    if is_file(directory / WEIGHTS_FILE, CheckpointError):
        return [directory / WEIGHTS_FILE]
    if is_file(directory / INDEX_FILE, CheckpointError):
        return _shard_files(directory / INDEX_FILE)
    names = list_directory(directory, CheckpointError)
    pickles = sorted(name for name in names if Path(name).suffix.lower() in PICKLE_SUFFIXES)
    if pickles:
        raise UnsafeCheckpointError(
            f"{directory}: the weights are only in {', '.join(pickles)}, a pickle file, and loading a pickle "
            f"can run arbitrary code; minigpt never unpickles. Use a safetensors checkpoint instead "
            f"(the hub's GPT-2 repos ship {WEIGHTS_FILE})"
        )
    raise CheckpointError(f"{directory}: no weights: looked for {WEIGHTS_FILE} and {INDEX_FILE}")


def _shard_files(index_path: Path) -> list[Path]:
    """The shard files a model.safetensors.index.json names in its weight_map, all present."""
    index = _read_json(index_path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"{index_path}: expected a non-empty 'weight_map' of tensor name -> shard file name")
    shards = []
    for name in sorted(set(weight_map.values())):
        if Path(name).name != name:
            raise CheckpointError(f"{index_path}: shard {name!r} is not a file name in the checkpoint directory")
        if not is_file(index_path.parent / name, CheckpointError):
            raise CheckpointError(f"{index_path}: shard {name!r} is missing")
        shards.append(index_path.parent / name)
    return shards


def _read_config(directory: Path) -> GPT2Config:
    """The GPT2Config of directory/config.json."""
    path = directory / CONFIG_FILE
    if not is_file(path, CheckpointError):
        raise CheckpointError(f"{directory}: no {CONFIG_FILE}, which holds GPT-2's sizes")
    return config_from_dict(_read_json(path), source=str(path))


def _read_json(path: Path) -> object:
    """A JSON file's content; unreadable or invalid JSON (a key twice in one object included) is a
    CheckpointError naming the file."""
    try:
        return json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=unique_keys)
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read: {e.strerror or e}") from e
    except (ValueError, RecursionError) as e:  # includes UnicodeDecodeError and JSONDecodeError
        raise CheckpointError(f"{path}: not valid JSON: {e}") from None


def _read_weights(config: GPT2Config, files: list[Path]) -> dict[str, np.ndarray]:
    """Every tensor `config` needs, by its unprefixed name, as checked float32 arrays: the layers,
    names and shapes from the headers before any data is read; then dtypes, finiteness, and that a
    stored lm_head.weight is the tied wte."""
    stored = _locate_tensors(files)
    directory = files[0].parent
    _check_layer_count(config, stored, directory)
    shapes = expected_shapes(config)
    _check_present(shapes, stored, directory)
    _check_nothing_left_over(config, shapes, stored, directory)
    for name, shape in shapes.items():
        _check_shape(stored[name], shape)
    tensors = _read_tensors(stored, [*shapes, LM_HEAD] if LM_HEAD in stored else list(shapes))
    for name in shapes:
        _check_finite(stored[name], tensors[name])
    if LM_HEAD in tensors:
        _check_tied(stored[LM_HEAD], tensors.pop(LM_HEAD), tensors["wte.weight"])
    return tensors


def _locate_tensors(files: list[Path]) -> dict[str, _StoredTensor]:
    """Unprefixed name -> where it is stored, from the files' headers; a name stored twice is an error."""
    stored: dict[str, _StoredTensor] = {}
    for path in files:
        for name, info in read_header(path).items():
            key = name.removeprefix(PREFIX)
            if key in stored:
                first = stored[key]
                raise CheckpointError(f"{path.parent}: tensor {key!r} is stored twice: as {first.name!r} in "
                                      f"{first.path.name} and as {name!r} in {path.name}")
            stored[key] = _StoredTensor(path, name, info)
    return stored


def _check_present(shapes: dict[str, tuple[int, ...]], stored: dict[str, _StoredTensor], directory: Path) -> None:
    """Every expected tensor is stored; else name the first five missing (another model lacks them all)."""
    missing = [name for name in shapes if name not in stored]
    if missing:
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(f"{directory}: the weights lack GPT-2 tensor(s) "
                              f"{', '.join(map(repr, missing[:5]))}{more}")


def _check_layer_count(config: GPT2Config, stored: dict[str, _StoredTensor], directory: Path) -> None:
    """config.json's n_layer is no more than the layers the weights hold (h.0, h.1, ...), and its
    GPT-2's tensors are not mostly missing, so that a config claiming a billion layers costs nothing
    in proportion before it is refused, nor one backed by a header of a million one-tensor layers."""
    layers = {name.split(".")[1] for name in stored if name.startswith("h.")}
    if config.n_layer > len(layers):
        names = ", ".join(repr(name) for name in list(stored)[:5]) or "none"
        raise CheckpointError(f"{directory}: config.json says n_layer {config.n_layer}, but the weights hold "
                              f"{len(layers)} layer(s) (h.0, h.1, ...)" + ("" if layers else
                              f": not GPT-2's tensors (the first of {len(stored)}: {names})"))
    needed = 4 + BLOCK_TENSORS * config.n_layer  # wte, wpe, ln_f's two and each block's
    if needed > 2 * len(stored):  # a few missing are named one by one (_check_present)
        raise CheckpointError(f"{directory}: config.json says n_layer {config.n_layer}, for which GPT-2 has "
                              f"{needed} tensors, but the weights hold {len(stored)}")


def _check_nothing_left_over(config: GPT2Config, shapes: dict[str, tuple[int, ...]],
                             stored: dict[str, _StoredTensor], directory: Path) -> None:
    """Every stored tensor is one the config uses, the tied LM head or a mask buffer: anything else
    (a layer beyond n_layer, another model's head) would be dropped silently."""
    ignored = {LM_HEAD, *(f"h.{i}.{buffer}" for i in range(config.n_layer) for buffer in MASK_BUFFERS)}
    extra = [name for name in stored if name not in shapes and name not in ignored]
    if extra:
        more = f" and {len(extra) - 5} more" if len(extra) > 5 else ""
        raise CheckpointError(f"{directory}: the weights hold tensor(s) {', '.join(map(repr, extra[:5]))}{more}, "
                              f"which a GPT-2 of config.json's sizes (n_layer {config.n_layer}) does not have")


def _check_shape(tensor: _StoredTensor, shape: tuple[int, ...]) -> None:
    """The header's shape is the one the config implies."""
    if tensor.info.shape != shape:
        raise CheckpointError(f"{tensor.path}: tensor {tensor.name!r} has shape {list(tensor.info.shape)}, "
                              f"expected {list(shape)} from config.json")


def _check_finite(tensor: _StoredTensor, value: np.ndarray) -> None:
    """No NaN or infinity: one would spread through every later activation."""
    if not np.isfinite(value).all():
        raise CheckpointError(f"{tensor.path}: tensor {tensor.name!r} contains NaN or infinite values")


def _check_tied(tensor: _StoredTensor, lm_head: np.ndarray, wte: np.ndarray) -> None:
    """A stored LM head must be wte bit for bit, since minigpt computes logits with wte."""
    if lm_head.shape != wte.shape or not np.array_equal(lm_head.view(np.uint32), wte.view(np.uint32)):
        raise CheckpointError(f"{tensor.path}: tensor {tensor.name!r} differs from 'wte.weight'; minigpt ties "
                              f"the LM head to the token embedding wte, as GPT-2 does")


def _read_tensors(stored: dict[str, _StoredTensor], names: list[str]) -> dict[str, np.ndarray]:
    """Unprefixed name -> float32 array for `names`, each file opened once."""
    by_file = defaultdict(list)
    for name in names:
        by_file[stored[name].path].append(name)
    tensors = {}
    for path, keys in by_file.items():
        arrays = read_safetensors(path, [stored[key].name for key in keys])
        tensors.update((key, arrays[stored[key].name]) for key in keys)
    return tensors
