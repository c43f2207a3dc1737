"""Broken, truncated, mislabelled and malicious checkpoints fail with a MinigptError that names the fault.

Each test builds one bad checkpoint by hand and checks the exception's type and that its message
names the file, tensor or field at fault. The fuzz test at the end checks that no damage at all
can make the loader fail any other way, or hand back weights it did not check.
"""

import functools
import json
import pickle
import tempfile
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minigpt.loading.checkpoint
from minigpt.loading.checkpoint import load_checkpoint
from minigpt.loading.checkpoint_writer import config_to_dict, save_checkpoint
from minigpt.gpt2.config import GPT2Config
from minigpt.errors import CheckpointError, ConfigError, MinigptError, UnsafeCheckpointError
from minigpt.loading.weights import expected_shapes, params_to_tensors, random_params
from minigpt.loading.safetensors_format import ITEMSIZE, write_safetensors

CONFIG = GPT2Config(vocab_size=16, n_positions=8, n_embd=8, n_layer=1, n_head=2, eos_token_id=None)
TENSORS = params_to_tensors(random_params(CONFIG, seed=0))


def write_checkpoint(directory: Path, tensors: dict[str, np.ndarray] = TENSORS, config: object = None) -> Path:
    """config.json (CONFIG's unless `config` is given) and model.safetensors holding `tensors`."""
    (directory / "config.json").write_text(json.dumps(config_to_dict(CONFIG) if config is None else config))
    write_safetensors(directory / "model.safetensors", tensors)
    return directory / "model.safetensors"


def split(blob: bytes) -> tuple[dict, bytes]:
    """A safetensors file's parsed header and its data buffer."""
    length = int.from_bytes(blob[:8], "little")
    return json.loads(blob[8:8 + length]), blob[8 + length:]


def with_length(header: bytes) -> bytes:
    """Raw header bytes behind their correct 8-byte length."""
    return len(header).to_bytes(8, "little") + header


def join(header: dict, data: bytes) -> bytes:
    return with_length(json.dumps(header).encode()) + data


def load_error(directory: Path, error: type = CheckpointError) -> str:
    """The message of the `error` loading `directory` raises (and it must raise exactly that type)."""
    with pytest.raises(MinigptError) as info:
        load_checkpoint(directory)
    assert type(info.value) is error, info.value
    return str(info.value)


# Where the weights are, and what is refused without being opened

def test_missing_directory_is_named(tmp_path):
    assert str(tmp_path / "nope") in load_error(tmp_path / "nope")


def test_empty_directory_names_the_files_looked_for(tmp_path):
    message = load_error(tmp_path)
    assert str(tmp_path) in message and "model.safetensors and model.safetensors.index.json" in message


@pytest.mark.parametrize("name", ["pytorch_model.bin", "model.pt", "weights.pth", "last.ckpt"])
def test_pickle_checkpoints_are_refused(tmp_path, name):
    (tmp_path / "config.json").write_text(json.dumps(config_to_dict(CONFIG)))
    (tmp_path / name).write_bytes(b"\x80\x04not really a pickle")
    message = load_error(tmp_path, UnsafeCheckpointError)
    assert name in message and "pickle" in message and "model.safetensors" in message


class CreatesFile:
    """Unpickling this runs open(path, "w"): a harmless stand-in for arbitrary code."""

    def __init__(self, path: Path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def test_a_malicious_pickle_is_never_unpickled(tmp_path):
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(CreatesFile(control))).close()
    assert control.exists()  # the payload is live: unpickling it does run code
    checkpoint, marker = tmp_path / "checkpoint", tmp_path / "marker"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps(config_to_dict(CONFIG)))
    (checkpoint / "pytorch_model.bin").write_bytes(pickle.dumps(CreatesFile(marker)))
    load_error(checkpoint, UnsafeCheckpointError)
    assert not marker.exists()


@pytest.mark.parametrize("name", ["model.safetensors.incomplete", "model.safetensors.part"])
def test_a_partial_download_is_not_loaded(tmp_path, name):
    write_checkpoint(tmp_path).rename(tmp_path / name)  # complete content, but not under the final name
    assert "no weights: looked for model.safetensors" in load_error(tmp_path)


# Damaged safetensors files

@pytest.mark.parametrize("cut, fault", [
    (lambda n: 0, "0 bytes, too short for the 8-byte header length"),
    (lambda n: 5, "5 bytes, too short for the 8-byte header length"),
    (lambda n: 8 + n // 2, "file is truncated: the header needs"),
    (lambda n: 8 + n + 3, "file is truncated: tensor 'h.0.attn.c_attn.bias' needs bytes up to"),
    (lambda n: -1, "file is truncated: tensor 'wte.weight' needs bytes up to"),
], ids=["empty", "in header length", "in header", "in data", "last byte"])
def test_truncated_file(tmp_path, cut, fault):
    path = write_checkpoint(tmp_path)
    blob = path.read_bytes()
    path.write_bytes(blob[:cut(int.from_bytes(blob[:8], "little"))])
    message = load_error(tmp_path)
    assert str(path) in message and fault in message


@pytest.mark.parametrize("blob, fault", [
    (bytes(8) + b"{}", "header length 0 is not in"),
    ((2**40).to_bytes(8, "little") + b"{}", "header length 1099511627776 is not in"),
    ((1000).to_bytes(8, "little") + b"{}", "file is truncated: the header needs 1000 bytes but 2 follow"),
    (with_length(b"\xff\xfe{}"), "header is not valid UTF-8 JSON"),
    (with_length(b"PK\x03\x04 a zip file"), "header is not valid UTF-8 JSON"),
    (with_length(b"[" * 100_000), "header is not valid UTF-8 JSON"),
    (with_length(b'{"a": {}, "a": {}}'), "header is not valid UTF-8 JSON: key 'a' appears twice"),
    (with_length(b"[1, 2]"), "header is not a JSON object but list"),
    (with_length(b'{"__metadata__": {"format": 1}}'), "'__metadata__' must map strings to strings"),
], ids=["zero length", "absurd length", "length past EOF", "not UTF-8", "not JSON", "deep nesting",
        "duplicate key", "not an object", "bad metadata"])
def test_garbage_header(tmp_path, blob, fault):
    path = write_checkpoint(tmp_path)
    path.write_bytes(blob)
    message = load_error(tmp_path)
    assert str(path) in message and fault in message


def set_field(field: str, value: object):
    return lambda entry: entry.__setitem__(field, value)


def shift_offsets(begin: int, end: int):
    return lambda entry: entry.__setitem__("data_offsets", [entry["data_offsets"][0] + begin,
                                                            entry["data_offsets"][1] + end])


@pytest.mark.parametrize("edit, fault", [
    (set_field("dtype", "F99"), "unknown dtype 'F99'"),
    (lambda entry: entry.pop("dtype"), "unknown dtype None"),
    (set_field("dtype", ["F32"]), "unknown dtype ['F32']"),
    (set_field("shape", [-8]), "'shape' must be a list of non-negative integers, got [-8]"),
    (set_field("shape", [True] * 8), "'shape' must be a list of non-negative integers"),
    (set_field("shape", [8.0]), "'shape' must be a list of non-negative integers"),
    (set_field("shape", 8), "'shape' must be a list of non-negative integers"),
    (set_field("data_offsets", [0, 32, 64]), "'data_offsets' must be [begin, end]"),
    (set_field("data_offsets", [32, 0]), "'data_offsets' must be [begin, end]"),
    (set_field("data_offsets", [-32, 0]), "'data_offsets' must be [begin, end]"),
    (shift_offsets(0, 4), "'data_offsets' span 36 bytes but F32 [8] needs 32"),
    (set_field("shape", [4]), "'data_offsets' span 32 bytes but F32 [4] needs 16"),
    (shift_offsets(10**6, 10**6), "file is truncated: tensor 'h.0.ln_1.bias' needs bytes up to"),
], ids=["unknown dtype", "no dtype", "dtype list", "negative dim", "bool dims", "float dim", "shape int",
        "three offsets", "begin > end", "negative offset", "span mismatch", "shape mismatch", "past the data"])
def test_malformed_header_entry(tmp_path, edit, fault):
    path = write_checkpoint(tmp_path)
    header, data = split(path.read_bytes())
    edit(header["h.0.ln_1.bias"])
    path.write_bytes(join(header, data))
    message = load_error(tmp_path)
    assert str(path) in message and "'h.0.ln_1.bias'" in message and fault in message


def test_a_header_entry_that_is_not_an_object(tmp_path):
    path = write_checkpoint(tmp_path)
    header, data = split(path.read_bytes())
    header["h.0.ln_1.bias"] = [0, 32]
    path.write_bytes(join(header, data))
    assert "tensor 'h.0.ln_1.bias': header entry is not an object" in load_error(tmp_path)


def overlap(header: dict, data: bytes) -> tuple[dict, bytes]:
    begin, end = header["h.0.ln_1.weight"]["data_offsets"]  # just after h.0.ln_1.bias, both [8] F32
    header["h.0.ln_1.weight"]["data_offsets"] = [begin - 16, end - 16]  # its first half in the bias
    return header, data


def gap(header: dict, data: bytes) -> tuple[dict, bytes]:
    for name, entry in header.items():
        if name != "__metadata__":
            entry["data_offsets"] = [offset + 8 for offset in entry["data_offsets"]]
    return header, bytes(8) + data


@pytest.mark.parametrize("edit, fault", [
    (overlap, "tensor 'h.0.ln_1.weight' begins at byte 1168 of the data and overlaps the tensors before it, "
              "which end at 1184"),
    (gap, "tensor 'h.0.attn.c_attn.bias' begins at byte 8 of the data and leaves a gap of 8 bytes"),
    (lambda header, data: (header, data + bytes(3)), "3 bytes follow the last tensor"),
], ids=["overlapping tensors", "gap before the first", "trailing bytes"])
def test_data_not_tiled_exactly_by_the_tensors_is_refused_as_by_the_reference_reader(tmp_path, edit, fault):
    path = write_checkpoint(tmp_path)
    path.write_bytes(join(*edit(*split(path.read_bytes()))))
    message = load_error(tmp_path)
    assert str(path) in message and fault in message
    load_file = pytest.importorskip("safetensors.numpy", reason="the reference reader to compare with").load_file
    with pytest.raises(Exception, match="invalid offset|incomplete metadata"):
        load_file(path)


# Well-formed files that are not this GPT-2

def test_missing_tensor_is_named(tmp_path):
    write_checkpoint(tmp_path, {k: v for k, v in TENSORS.items() if k != "h.0.mlp.c_fc.bias"})
    assert "lack GPT-2 tensor(s) 'h.0.mlp.c_fc.bias'" in load_error(tmp_path)


def test_another_architecture_names_the_first_missing_tensors(tmp_path):
    write_checkpoint(tmp_path, {name: value for name, value in TENSORS.items() if not name.startswith(("wte", "ln_f"))})
    message = load_error(tmp_path)
    assert "lack GPT-2 tensor(s) 'wte.weight', 'ln_f.weight', 'ln_f.bias'" in message


def test_another_architecture_without_gpt2_layers_names_its_tensors(tmp_path):
    write_checkpoint(tmp_path, {"model.embed_tokens.weight": np.zeros((16, 8), np.float32)})
    message = load_error(tmp_path)
    assert "n_layer 1, but the weights hold 0 layer(s)" in message and "'model.embed_tokens.weight'" in message


def test_layers_of_one_tensor_each_back_no_config_size(tmp_path, monkeypatch):
    """A header of thousands of one-tensor layers (h.1.x, h.2.x, ...) does not make config.json's
    n_layer cost memory in proportion: GPT-2's tensors for it are counted before any table of their
    names is built."""
    dummies = {f"h.{i}.x": np.zeros(0, np.float32) for i in range(1, 5000)}
    config = config_to_dict(CONFIG) | {"n_layer": 5000}
    write_checkpoint(tmp_path, TENSORS | dummies, config)

    def expected_shapes(config):
        pytest.fail(f"a table of {config.n_layer} layers' names was built")

    monkeypatch.setattr(minigpt.loading.checkpoint, "expected_shapes", expected_shapes)
    assert "n_layer 5000, for which GPT-2 has 60004 tensors, but the weights hold 5015" in load_error(tmp_path)


def test_wrong_shape_names_tensor_and_both_shapes(tmp_path):
    path = write_checkpoint(tmp_path, TENSORS | {"h.0.mlp.c_fc.weight": TENSORS["h.0.mlp.c_fc.weight"].T})
    message = load_error(tmp_path)
    assert f"{path}: tensor 'h.0.mlp.c_fc.weight' has shape [32, 8], expected [8, 32]" in message


def test_a_shape_the_config_does_not_imply_is_refused_before_any_data_is_read(tmp_path, monkeypatch):
    write_checkpoint(tmp_path, TENSORS | {"wpe.weight": np.zeros((10**4, 8), np.float32)})

    def read_safetensors(*args, **kwargs):
        pytest.fail("tensor data was read before the header's shapes were checked")

    monkeypatch.setattr(minigpt.loading.checkpoint, "read_safetensors", read_safetensors)
    assert "tensor 'wpe.weight' has shape [10000, 8], expected [8, 8]" in load_error(tmp_path)


def test_integer_weights_are_refused(tmp_path):
    save_file = pytest.importorskip("safetensors.numpy", reason="writes an I64 tensor").save_file
    path = write_checkpoint(tmp_path)
    save_file(TENSORS | {"h.0.ln_1.bias": np.arange(8)}, path)
    message = load_error(tmp_path)
    assert "tensor 'h.0.ln_1.bias' has dtype I64, expected float32" in message


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
def test_non_finite_weight_is_named(tmp_path, value):
    weight = TENSORS["h.0.attn.c_proj.weight"].copy()
    weight[3, 5] = value
    path = write_checkpoint(tmp_path, TENSORS | {"h.0.attn.c_proj.weight": weight})
    assert f"{path}: tensor 'h.0.attn.c_proj.weight' contains NaN or infinite values" in load_error(tmp_path)


def test_an_untied_lm_head_is_refused(tmp_path):
    write_checkpoint(tmp_path, TENSORS | {"lm_head.weight": TENSORS["wte.weight"] + np.float32(1)})
    message = load_error(tmp_path)
    assert "'lm_head.weight' differs from 'wte.weight'" in message and "ties" in message


def test_a_tensor_stored_with_and_without_prefix_is_refused(tmp_path):
    write_checkpoint(tmp_path, TENSORS | {"transformer.wpe.weight": TENSORS["wpe.weight"]})
    assert "tensor 'wpe.weight' is stored twice" in load_error(tmp_path)


@pytest.mark.parametrize("extra", ["score.weight", "h.1.attn.bias", "h.0.attn.c_attn.bias.extra"])
def test_a_tensor_the_config_has_no_place_for_is_refused_not_dropped(tmp_path, extra):
    write_checkpoint(tmp_path, TENSORS | {extra: np.zeros(8, np.float32)})
    message = load_error(tmp_path)
    assert f"the weights hold tensor(s) {extra!r}, which a GPT-2 of config.json's sizes (n_layer 1)" in message


def test_only_the_exact_mask_buffer_names_are_ignored(tmp_path):
    save_file = pytest.importorskip("safetensors.numpy", reason="writes bool mask buffers").save_file
    path = write_checkpoint(tmp_path)
    masks = {"h.0.attn.bias": np.tril(np.ones((1, 1, 8, 8), dtype=bool)), "h.0.attn.masked_bias": np.array(-1e4)}
    save_file(TENSORS | masks, path)
    load_checkpoint(tmp_path)  # masks of any dtype are skipped unread
    save_file({k: v for k, v in TENSORS.items() if k != "h.0.attn.c_attn.bias"} | masks, path)
    assert "'h.0.attn.c_attn.bias'" in load_error(tmp_path)


# config.json

def test_missing_config_is_named(tmp_path):
    write_checkpoint(tmp_path)
    (tmp_path / "config.json").unlink()
    assert f"{tmp_path}: no config.json" in load_error(tmp_path)


def test_invalid_config_json_names_the_file(tmp_path):
    write_checkpoint(tmp_path)
    (tmp_path / "config.json").write_text('{"n_embd": 8,')
    assert f"{tmp_path / 'config.json'}: not valid JSON" in load_error(tmp_path)


@pytest.mark.parametrize("change, fault", [
    ({"n_head": 3}, "'n_embd' (8) must be divisible by 'n_head' (3)"),
    ({"n_layer": 0}, "'n_layer' must be an integer >= 1, got 0"),
    ({"vocab_size": -16}, "'vocab_size' must be an integer >= 1, got -16"),
    ({"n_embd": "8"}, "'n_embd' must be an integer >= 1, got '8'"),
], ids=["indivisible heads", "zero layers", "negative vocab", "string size"])
def test_bad_config_field(tmp_path, change, fault):
    write_checkpoint(tmp_path, config=config_to_dict(CONFIG) | change)
    message = load_error(tmp_path, ConfigError)
    assert str(tmp_path / "config.json") in message and fault in message


def test_missing_config_field(tmp_path):
    config = config_to_dict(CONFIG)
    del config["n_head"]
    write_checkpoint(tmp_path, config=config)
    assert f"{tmp_path / 'config.json'}: missing field 'n_head'" in load_error(tmp_path, ConfigError)


# Sharded checkpoints

def test_missing_shard_is_named(tmp_path):
    save_checkpoint(tmp_path, CONFIG, random_params(CONFIG), shards=2)
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    assert "shard 'model-00002-of-00002.safetensors' is missing" in load_error(tmp_path)


@pytest.mark.parametrize("index, fault", [
    ("{", "not valid JSON"),
    ('{"metadata": {}}', "expected a non-empty 'weight_map'"),
    ('{"weight_map": {"wte.weight": 3}}', "expected a non-empty 'weight_map'"),
    ('{"weight_map": {"wte.weight": "../model.safetensors"}}', "is not a file name in the checkpoint directory"),
], ids=["invalid JSON", "no weight_map", "shard not a string", "shard outside"])
def test_bad_shard_index(tmp_path, index, fault):
    (tmp_path / "config.json").write_text(json.dumps(config_to_dict(CONFIG)))
    (tmp_path / "model.safetensors.index.json").write_text(index)
    message = load_error(tmp_path)
    assert "model.safetensors.index.json" in message and fault in message


# Fuzzing: random damage to a valid file

@functools.cache
def valid_checkpoint() -> tuple[bytes, str]:
    """A valid tiny checkpoint's model.safetensors bytes and config.json text."""
    with tempfile.TemporaryDirectory() as directory:
        save_checkpoint(directory, CONFIG, random_params(CONFIG, seed=1), attn_bias=True)
        return (Path(directory) / "model.safetensors").read_bytes(), (Path(directory) / "config.json").read_text()


def json_values(data_size: int) -> st.SearchStrategy:
    """JSON values, weighted towards near-valid dtypes, shapes and offsets."""
    near = st.integers(-2, data_size + 8)
    scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=4)
               | st.sampled_from(sorted(ITEMSIZE)) | near)
    return st.lists(near, max_size=3) | st.recursive(
        scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=2),
        max_leaves=6,
    )


@st.composite
def edited_header(draw, blob: bytes) -> bytes:
    """The file with 1 to 3 header fields (or whole entries, maybe new ones) set to random JSON values."""
    header, data = split(blob)
    names = sorted(header) + ["wte.weight", "lm_head.weight", "__metadata__"]
    for _ in range(draw(st.integers(1, 3))):
        name = draw(st.sampled_from(names))
        field = draw(st.sampled_from(["dtype", "shape", "data_offsets", None]))
        value = draw(json_values(len(data)))
        entry = header.setdefault(name, {})
        if field is not None and isinstance(entry, dict):
            entry[field] = value
        else:
            header[name] = value
    return join(header, data)


def damaged(blob: bytes) -> st.SearchStrategy[bytes]:
    """`blob` with bytes overwritten, cut short, a random header length, or header fields edited."""
    length = int.from_bytes(blob[:8], "little")
    overwrites = st.lists(st.tuples(st.integers(0, len(blob) - 1), st.integers(0, 255)), min_size=1, max_size=8)
    lengths = st.integers(0, 2**64 - 1) | st.integers(max(0, length - 16), length + 16)
    return st.one_of(
        overwrites.map(lambda edits: bytes(overwrite(bytearray(blob), edits))),
        st.integers(0, len(blob) - 1).map(lambda n: blob[:n]),
        lengths.map(lambda n: n.to_bytes(8, "little") + blob[8:]),
        edited_header(blob),
    )


def overwrite(blob: bytearray, edits: list[tuple[int, int]]) -> bytearray:
    for position, byte in edits:
        blob[position] = byte
    return blob


@settings(max_examples=200, deadline=timedelta(seconds=2), suppress_health_check=[HealthCheck.too_slow])
@given(blob=st.deferred(lambda: damaged(valid_checkpoint()[0])))
def test_damaged_file_loads_checked_weights_or_raises_minigpt_error(blob):
    """Property: whatever the damage, load_checkpoint either returns weights of exactly the
    expected shapes, float32 and finite, or raises a MinigptError; never another exception."""
    with tempfile.TemporaryDirectory() as directory:
        (Path(directory) / "model.safetensors").write_bytes(blob)
        (Path(directory) / "config.json").write_text(valid_checkpoint()[1])
        try:
            config, params = load_checkpoint(directory)
        except MinigptError:
            return
    tensors = params_to_tensors(params)
    assert {name: t.shape for name, t in tensors.items()} == expected_shapes(config)
    assert all(t.dtype == np.float32 and np.isfinite(t).all() for t in tensors.values())
