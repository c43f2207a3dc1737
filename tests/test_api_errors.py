"""Hostile inputs and faults through the API: one documented MinigptError that names the culprit.

Every row of docs/errors.md is checked here through `minigpt.load`, `Model.forward`,
`minigpt.generate` and `minigpt.stream` (test_cli_errors.py runs the same rows through the CLI;
tests/test_hostile_checkpoints.py goes deeper into damaged files at the `load_checkpoint` level).
A request that cannot succeed is refused before any work: `no_work` makes running a transformer
block fail the test.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pickle
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minigpt
import minigpt.loading
import minigpt.model
from minigpt.checkpoint import save_checkpoint
from minigpt.config import GPT2Config
from minigpt.errors import (CheckpointError, ConfigError, ContextLengthError, InputError, MinigptError,
                            ModelNotFoundError, OfflineError, UnsafeCheckpointError)
from minigpt.params import params_to_tensors, random_params
from minigpt.safetensors_format import read_safetensors, write_safetensors

# vocab_size 50257 so that GPT-2's tokenizer works with it; everything else as small as it gets.
TINY = GPT2Config(n_layer=1, n_embd=8, n_head=2, n_positions=32)
EOT = 50256
ALIASES = ("gpt2", "gpt2-medium", "distilgpt2", "random-124m")


def make_checkpoint(directory: Path, config: GPT2Config = TINY) -> Path:
    """A valid random checkpoint of `config` in `directory` (it uses the MINIGPT_BPE_DIR tokenizer)."""
    save_checkpoint(directory, config, random_params(config, seed=1))
    return directory


# Broken checkpoints. Each function breaks a valid one and returns what the error message must name.

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
    tensors = read_safetensors(weights(directory))
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
]


def test_the_unbroken_tiny_checkpoint_loads_and_generates(tmp_path, tokenizer):
    """The baseline every broken checkpoint below departs from."""
    model = minigpt.load(make_checkpoint(tmp_path))
    assert model.config == TINY
    assert len(minigpt.generate(model, [464, 3290], 3, stop_at_eos=False).tokens) == 3


@pytest.mark.parametrize("breaks, error", BROKEN_CHECKPOINTS)
def test_a_broken_checkpoint_raises_its_documented_error_naming_the_fault(tmp_path, breaks, error):
    directory = make_checkpoint(tmp_path / "ckpt")
    names = breaks(directory)
    with pytest.raises(MinigptError) as caught:
        minigpt.load(str(directory))
    assert type(caught.value) is error, caught.value
    for name in names:
        assert name in str(caught.value)
    assert not (directory / "unpickled").exists(), "a pickle was unpickled"


# Model sources: missing paths, typos, the hub offline, interrupted downloads

@pytest.fixture
def empty_hub_cache(tmp_path, monkeypatch) -> Path:
    """huggingface_hub's cache redirected to an empty folder (HF_HUB_OFFLINE=1 comes from conftest)."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    return cache


def load_error(source, error: type) -> str:
    with pytest.raises(MinigptError) as caught:
        minigpt.load(source)
    assert type(caught.value) is error, caught.value
    return str(caught.value)


def test_a_missing_path_is_named_with_the_known_aliases(tmp_path):
    message = load_error(str(tmp_path / "no-such-dir"), ModelNotFoundError)
    assert str(tmp_path / "no-such-dir") in message
    assert all(alias in message for alias in ALIASES)


@pytest.mark.parametrize("typo, meant", [("gtp2", "gpt2"), ("GPT2", "gpt2"), ("gpt2-larg", "gpt2-large"),
                                         ("random-124", "random-124m")])
def test_a_typo_in_an_alias_suggests_the_alias(typo, meant):
    message = load_error(typo, ModelNotFoundError)
    assert repr(typo) in message and f"did you mean {meant!r}" in message


@pytest.mark.parametrize("source", ["", "not/a valid id", "-/-"])
def test_a_source_that_is_no_path_and_no_hub_id_is_refused(source, empty_hub_cache):
    assert all(alias in load_error(source, ModelNotFoundError) for alias in ALIASES)


def test_a_file_is_not_a_checkpoint_directory(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert "is a file" in load_error(str(tmp_path / "model.safetensors"), ModelNotFoundError)


@pytest.mark.parametrize("source, repo_id", [("gpt2", "openai-community/gpt2"),
                                             ("someone/their-gpt2", "someone/their-gpt2")])
def test_an_uncached_hub_model_offline_says_so_and_what_to_do(source, repo_id, empty_hub_cache):
    message = load_error(source, OfflineError)
    assert repr(repo_id) in message and "offline" in message
    assert "local checkpoint directory" in message and "random-124m" in message


def test_an_unreachable_hub_is_offline(monkeypatch):
    """HF_HUB_OFFLINE unset but no network: huggingface_hub finds no cached copy and says so."""
    from huggingface_hub.errors import LocalEntryNotFoundError

    def unreachable(repo_id, **_):
        raise LocalEntryNotFoundError("An error happened while trying to locate the files on the Hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", unreachable)
    message = load_error("distilgpt2", OfflineError)
    assert "'distilbert/distilgpt2'" in message and "random-124m" in message


class ReadError(Exception):
    """Like the HTTP client's error when a connection drops mid-file: not an OSError."""


def test_an_interrupted_download_is_an_error_and_the_next_run_starts_clean(tmp_path, monkeypatch, tokenizer):
    partial = tmp_path / "blobs" / "0123abcd.incomplete"

    def interrupted(repo_id, **_):
        partial.parent.mkdir(exist_ok=True)
        partial.write_bytes(b"\x00" * 100)  # what huggingface_hub leaves behind to resume from
        raise ReadError("connection reset by peer")

    def never_loaded(directory):
        pytest.fail(f"loaded {directory} after a failed download")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", interrupted)
    monkeypatch.setattr(minigpt.loading, "load_checkpoint", never_loaded)
    message = load_error("gpt2", OfflineError)
    assert "'openai-community/gpt2'" in message and "ReadError" in message and "resume" in message

    monkeypatch.undo()  # the next run: the download completes
    finished = make_checkpoint(tmp_path / "snapshot")
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id, **_: str(finished))
    assert minigpt.load("gpt2").config == TINY


def test_a_cached_snapshot_cut_off_mid_download_is_never_loaded(empty_hub_cache):
    """huggingface_hub's layout after an interrupted download: the weights blob still `.incomplete`,
    so no model.safetensors link in the snapshot. Offline, minigpt names what is missing and says to resume."""
    commit = "a" * 40
    repo = empty_hub_cache / "models--openai-community--gpt2"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    (repo / "blobs").mkdir()
    (repo / "blobs" / ("b" * 64 + ".incomplete")).write_bytes(b"\x00" * 1000)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    message = load_error("gpt2", OfflineError)
    assert commit in message and "model.safetensors" in message and "resume" in message


def test_an_unknown_kernel_set_is_named():
    with pytest.raises(InputError, match="'fastest'"):
        minigpt.load("random-tiny", kernels="fastest")


# Token ids

@pytest.fixture
def no_work(monkeypatch):
    """Make running any transformer block fail the test: for checks that must come before any work."""
    def block(*args, **kwargs):
        pytest.fail("a transformer block ran before the request was refused")

    monkeypatch.setattr(minigpt.model, "block", block)


ENTRY_POINTS = {
    "forward": lambda model, ids, **kw: model.forward(ids),
    "generate": lambda model, ids, n=1, **kw: minigpt.generate(model, ids, n, **kw),
    "stream": lambda model, ids, n=1, **kw: minigpt.stream(model, ids, n, **kw),  # raises at the call
}
GENERATE_ENTRY_POINTS = ["generate", "stream"]

BAD_IDS = [  # ids, what the message must name
    pytest.param([464, 50257], ["50257", "index 1", "[0, 50257)"], id="too-large"),
    pytest.param([464, 3290, -1], ["-1", "index 2"], id="negative"),
    pytest.param([464, 2.0], ["2.0", "index 1"], id="float"),
    pytest.param([True, 464], ["True", "index 0"], id="bool"),
    pytest.param([464, "3290"], ["'3290'", "index 1"], id="string-id"),
    pytest.param([464, None], ["None", "index 1"], id="none"),
    pytest.param("The dog", ["'The dog'", "minigpt.encode"], id="text-not-ids"),
    pytest.param([[464, 3290]], ["1-D", "(1, 2)"], id="2-D"),
    pytest.param(np.array([464.0, 3290.5]), ["464.0", "index 0"], id="numpy-float"),
    pytest.param(np.array([464, 60000], dtype=np.int32), ["60000", "index 1"], id="numpy-int-too-large"),
    pytest.param(np.array([[1]], dtype=np.int64), ["1-D", "(1, 1)"], id="numpy-2-D"),
]


@pytest.mark.parametrize("entry", ENTRY_POINTS)
@pytest.mark.parametrize("ids, names", BAD_IDS)
def test_bad_token_ids_name_the_offending_id(tiny_model, no_work, entry, ids, names):
    with pytest.raises(InputError) as caught:
        ENTRY_POINTS[entry](tiny_model, ids)
    for name in names:
        assert name in str(caught.value)


@given(prefix=st.lists(st.integers(0, EOT), max_size=5),
       bad=st.one_of(st.integers(max_value=-1), st.integers(min_value=EOT + 1)))
def test_any_out_of_range_id_is_named_with_its_index(tiny_model, prefix, bad):
    """Property: whatever valid ids precede it, an id outside [0, vocab_size) is named with its index."""
    with pytest.raises(InputError, match=rf"token id {bad} at index {len(prefix)} is outside"):
        minigpt.generate(tiny_model, [*prefix, bad, 0], 1)


def test_numpy_integer_ids_of_any_width_are_accepted(tiny_model):
    for dtype in (np.uint16, np.int32, np.int64):
        assert minigpt.generate(tiny_model, np.array([464, 3290], dtype), 1).prompt_ids == [464, 3290]


def test_forward_of_no_ids_is_refused(tiny_model):
    with pytest.raises(InputError, match="at least one token"):
        tiny_model.forward([])


# Sampling options and lengths

BAD_OPTIONS = [  # generate's keyword arguments, the option the message must name
    pytest.param(dict(temperature=-0.5), "temperature", id="temperature<0"),
    pytest.param(dict(temperature=math.nan), "temperature", id="temperature-nan"),
    pytest.param(dict(temperature=math.inf), "temperature", id="temperature-inf"),
    pytest.param(dict(top_p=0.0), "top_p", id="top_p=0"),
    pytest.param(dict(top_p=1.5), "top_p", id="top_p>1"),
    pytest.param(dict(top_p=math.nan), "top_p", id="top_p-nan"),
    pytest.param(dict(top_k=0), "top_k", id="top_k=0"),
    pytest.param(dict(top_k=2.5), "top_k", id="top_k-float"),
    pytest.param(dict(seed=-1), "seed", id="seed<0"),
    pytest.param(dict(n=-1), "max_new_tokens", id="max_new_tokens<0"),
    pytest.param(dict(n=2.0), "max_new_tokens", id="max_new_tokens-float"),
]


@pytest.mark.parametrize("entry", GENERATE_ENTRY_POINTS)
@pytest.mark.parametrize("options, option", BAD_OPTIONS)
def test_a_bad_sampling_option_is_named_before_any_work(tiny_model, no_work, entry, options, option):
    with pytest.raises(InputError, match=option):
        ENTRY_POINTS[entry](tiny_model, [464], **options)


@pytest.mark.parametrize("entry", GENERATE_ENTRY_POINTS)
@pytest.mark.parametrize("prompt_length, n", [(250, 10), (1, 256), (0, 256), (300, 0)])
def test_prompt_plus_new_tokens_beyond_the_context_is_refused_before_any_work(
        tiny_model, no_work, entry, prompt_length, n):
    with pytest.raises(ContextLengthError) as caught:
        ENTRY_POINTS[entry](tiny_model, [464] * prompt_length, n)
    assert "256 (n_positions)" in str(caught.value) and f"{n} new tokens" in str(caught.value)


def test_forward_beyond_the_context_is_refused(tiny_model, no_work):
    with pytest.raises(ContextLengthError, match="256"):
        tiny_model.forward([464] * 257)


def test_truncate_prompt_keeps_the_last_tokens(tiny_model):
    prompt = list(range(300))
    result = minigpt.generate(tiny_model, prompt, 6, truncate_prompt=True, stop_at_eos=False)
    assert result.prompt_ids == prompt[-250:] and len(result.tokens) == 6


def test_truncate_prompt_cannot_make_room_for_more_tokens_than_the_context(tiny_model, no_work):
    with pytest.raises(ContextLengthError, match="256"):
        minigpt.generate(tiny_model, [464], 256, truncate_prompt=True)


# Text: the empty prompt, a literal <|endoftext|>, any Unicode

def test_an_empty_prompt_starts_from_endoftext(tiny_model, tokenizer):
    ids = minigpt.encode(tiny_model.tokenizer, "")
    assert ids == []
    assert minigpt.generate(tiny_model, ids, 2).prompt_ids == [EOT]
    assert len(list(minigpt.stream(tiny_model, np.array([], np.int64), 2, stop_at_eos=False))) == 2


def test_an_empty_prompt_is_refused_without_an_endoftext_to_start_from(tiny_model, no_work):
    no_eot = dataclasses.replace(tiny_model, config=dataclasses.replace(tiny_model.config, eos_token_id=None))
    with pytest.raises(InputError, match="empty.*<\\|endoftext\\|>"):
        minigpt.generate(no_eot, [], 1)


@pytest.mark.parametrize("text", ["<|endoftext|>", "a<|endoftext|>b", "<|endoftext|><|endoftext|>"])
def test_a_literal_endoftext_is_ordinary_text(tokenizer, text):
    ids = minigpt.encode(tokenizer, text)
    assert EOT not in ids and tokenizer.decode(ids) == text


def test_a_lone_surrogate_becomes_the_replacement_character(tokenizer):
    """Not valid Unicode (e.g. undecodable bytes in a command line); encoded, never an exception."""
    assert tokenizer.decode(minigpt.encode(tokenizer, "a\ud800b")) == "a\ufffdb"


@given(st.lists(st.one_of(st.text(max_size=12), st.just("<|endoftext|>")), max_size=3).map("".join))
def test_any_text_encodes_as_text_round_trips_and_can_be_continued(tiny_model, tokenizer, text):
    """Property: any Unicode text, literal "<|endoftext|>" included, encodes without the special token,
    decodes back to itself, and generation continues it (from <|endoftext|> when it is empty)."""
    ids = minigpt.encode(tiny_model.tokenizer, text)
    assert EOT not in ids
    assert tiny_model.tokenizer.decode(ids) == text
    assert minigpt.generate(tiny_model, ids, 1).prompt_ids == (ids or [EOT])


def test_a_missing_relative_path_is_not_taken_for_a_hub_id(tmp_path, monkeypatch):
    """`weights/gpt2` with `weights/` present but no `gpt2` in it is a missing directory, not a download."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights").mkdir()
    message = load_error("weights/gpt2", ModelNotFoundError)
    assert "no directory 'weights/gpt2'" in message
