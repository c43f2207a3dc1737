"""Hostile inputs and faults through the API: one documented MinigptError that names the culprit.

Every row of docs/loading.md is checked here through `minigpt.load`, `Model.forward`,
`minigpt.generate` and `minigpt.stream` (test_cli_errors.py runs the same rows through the CLI;
tests/loading/test_hostile_checkpoints.py goes deeper into damaged files at the `load_checkpoint` level).
A request that cannot succeed is refused before any work: `no_work` makes running a transformer
block fail the test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import math
import os
import re
import tracemalloc
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import huggingface_hub
import huggingface_hub.constants
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from checkpoints import (ALIASES, BROKEN_CHECKPOINTS, EOT, TINY, ReadError, edit_config, make_checkpoint, weights,
                         with_huge_position)

import minigpt
import minigpt.loading.loader
import minigpt.gpt2.forward
import minigpt.cache.kv_cache
import minigpt.exact.batched
import minigpt.exact.tracing
from minigpt.engine.paging import PagedCache, PagePool
from minigpt.gpt2.config import GPT2Config
from minigpt.api.api import prove
from minigpt.errors import (CheckpointError, ContextLengthError, InputError, MinigptError, ModelNotFoundError,
                            NumericalError, OfflineError, TokenizerError)
from minigpt.loading.weights import params_from_tensors, params_to_tensors, random_params

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


def test_an_interrupted_download_is_an_error_and_the_next_run_starts_clean(tmp_path, monkeypatch, tokenizer):
    partial = tmp_path / "blobs" / "0123abcd.incomplete"

    def interrupted(repo_id, **_):
        partial.parent.mkdir(exist_ok=True)
        partial.write_bytes(b"\x00" * 100)  # what huggingface_hub leaves behind to resume from
        raise ReadError("connection reset by peer")

    def never_loaded(directory):
        pytest.fail(f"loaded {directory} after a failed download")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", interrupted)
    monkeypatch.setattr(minigpt.loading.loader, "load_checkpoint", never_loaded)
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

    for module in (minigpt.gpt2.forward, minigpt.cache.kv_cache, minigpt.exact.batched):  # every forward's blocks
        monkeypatch.setattr(module, "block", block)


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
    pytest.param(dict(top_logprobs=21), r"top_logprobs must be an integer in 0\.\.20, got 21", id="top_logprobs>20"),
    pytest.param(dict(top_logprobs=10 ** 20), "top_logprobs", id="top_logprobs-huge"),
    pytest.param(dict(draft_tokens=4), r"draft_tokens \(4\) has no effect without speculate", id="draft-alone"),
]


@pytest.mark.parametrize("entry", GENERATE_ENTRY_POINTS)
@pytest.mark.parametrize("options, option", BAD_OPTIONS)
def test_a_bad_sampling_option_is_named_before_any_work(tiny_model, no_work, entry, options, option):
    with pytest.raises(InputError, match=option):
        ENTRY_POINTS[entry](tiny_model, [464], **options)


@pytest.mark.parametrize("entry", GENERATE_ENTRY_POINTS)
@pytest.mark.parametrize("prompt_length, n", [(250, 8), (1, 257), (0, 257), (2, 256), (300, 0)])
def test_prompt_plus_new_tokens_beyond_the_context_is_refused_before_any_work(
        tiny_model, no_work, entry, prompt_length, n):
    """The last new token is never fed: prompt + new tokens - 1 positions must fit in the 256."""
    with pytest.raises(ContextLengthError) as caught:
        ENTRY_POINTS[entry](tiny_model, [464] * prompt_length, n)
    assert "256 (n_positions)" in str(caught.value) and f"{n} new tokens" in str(caught.value)


@pytest.mark.parametrize("entry", GENERATE_ENTRY_POINTS)
@pytest.mark.parametrize("prompt_length, n", [(250, 7), (1, 256), (0, 256), (256, 1), (256, 0)])
def test_a_generation_may_fill_the_whole_context(tiny_model, entry, prompt_length, n):
    """prompt + new tokens - 1 = 256 positions: the whole context is used, the last token returned unfed."""
    tokens = [t.token for t in minigpt.stream(tiny_model, [464] * prompt_length, n, stop_at_eos=False)] \
        if entry == "stream" else minigpt.generate(tiny_model, [464] * prompt_length, n, stop_at_eos=False).tokens
    assert len(tokens) == n


def test_forward_beyond_the_context_is_refused(tiny_model, no_work):
    with pytest.raises(ContextLengthError, match="256"):
        tiny_model.forward([464] * 257)


@pytest.mark.parametrize("length, message", [(9, "cannot truncate a cache of length 5 to 9"),
                                             (-1, "length must be an integer >= 0, got -1"),
                                             (2.0, "length must be an integer >= 0, got 2.0")])
def test_a_cache_truncated_to_a_length_it_does_not_hold_is_refused_and_left_as_it_was(tiny_model, length, message):
    cache = tiny_model.new_cache()
    tiny_model.forward([1, 2, 3, 4, 5], cache)
    with pytest.raises(InputError, match=re.escape(message)):
        cache.truncate(length)
    assert cache.length == 5


def test_truncate_prompt_keeps_the_last_tokens(tiny_model):
    prompt = list(range(300))
    result = minigpt.generate(tiny_model, prompt, 6, truncate_prompt=True, stop_at_eos=False)
    assert result.prompt_ids == prompt[-251:] and len(result.tokens) == 6  # 251 + 6 - 1 = 256 positions


def test_truncate_prompt_cannot_make_room_for_more_tokens_than_the_context(tiny_model, no_work):
    with pytest.raises(ContextLengthError, match="256"):
        minigpt.generate(tiny_model, [464], 257, truncate_prompt=True)


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
def test_a_literal_endoftext_is_the_special_token_or_ordinary_text_without_special_tokens(tokenizer, text):
    ids = minigpt.encode(tokenizer, text)
    assert ids.count(EOT) == text.count("<|endoftext|>") and tokenizer.decode(ids) == text
    ids = minigpt.encode(tokenizer, text, special_tokens=False)
    assert EOT not in ids and tokenizer.decode(ids) == text


def test_a_lone_surrogate_becomes_the_replacement_character(tokenizer):
    """Not valid Unicode (e.g. undecodable bytes in a command line); encoded, never an exception."""
    assert tokenizer.decode(minigpt.encode(tokenizer, "a\ud800b")) == "a\ufffdb"


@given(st.lists(st.one_of(st.text(max_size=12), st.just("<|endoftext|>")), max_size=3).map("".join))
def test_any_text_encodes_with_endoftext_as_its_token_round_trips_and_can_be_continued(tiny_model, tokenizer,
                                                                                        text):
    """Property: any Unicode text, literal "<|endoftext|>" included, encodes with one special token per
    literal (none with special_tokens=False), decodes back to itself, and generation continues it (from
    <|endoftext|> when it is empty)."""
    ids = minigpt.encode(tiny_model.tokenizer, text)
    assert ids.count(EOT) == text.count("<|endoftext|>")
    assert tiny_model.tokenizer.decode(ids) == text
    assert EOT not in minigpt.encode(tiny_model.tokenizer, text, special_tokens=False)
    assert minigpt.generate(tiny_model, ids, 1).prompt_ids == (ids or [EOT])


def test_a_missing_relative_path_is_not_taken_for_a_hub_id(tmp_path, monkeypatch):
    """`weights/gpt2` with `weights/` present but no `gpt2` in it is a missing directory, not a download."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights").mkdir()
    message = load_error("weights/gpt2", ModelNotFoundError)
    assert "no directory 'weights/gpt2'" in message


# Sizes no file backs, unreadable directories, entries that are not files

def test_a_config_claiming_a_billion_layers_costs_no_memory_in_proportion(tmp_path):
    directory = make_checkpoint(tmp_path)
    edit_config(directory, n_layer=10**9)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="n_layer 1000000000, but the weights hold 1 layer"):
            minigpt.load(directory)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2**20, f"{peak} bytes allocated to refuse a 400-byte config"


@contextlib.contextmanager
def unreadable(directory: Path, mode: int, monkeypatch):
    """`directory` with permission bits `mode`. Root ignores them: as root, the calls a non-root user's
    process would see refused (stat under a directory without x, listing one without r) are made to
    fail as they would, with PermissionError."""
    def refused(path) -> PermissionError:
        return PermissionError(errno.EACCES, "Permission denied", str(path))

    def stat(path, *args, **kwargs):
        if not mode & 0o100 and Path(path).parent == directory:
            raise refused(path)
        return real_stat(path, *args, **kwargs)

    def listdir(path="."):
        if not mode & 0o400 and Path(path) == directory:
            raise refused(path)
        return real_listdir(path)

    real_stat, real_listdir = os.stat, os.listdir
    directory.chmod(mode)
    if os.geteuid() == 0:
        print(f"running as root, whom mode {mode:o} does not stop: os.stat and os.listdir refuse as for a user")
        monkeypatch.setattr(os, "stat", stat)
        monkeypatch.setattr(os, "listdir", listdir)
    try:
        yield directory
    finally:
        monkeypatch.undo()
        directory.chmod(0o755)


@pytest.mark.parametrize("mode, has_weights, fault", [
    (0o000, True, "cannot look into the directory"),
    (0o600, True, "cannot look into the directory"),
    (0o300, False, "cannot list the directory"),
], ids=["mode-000", "mode-600", "mode-300-no-weights"])
def test_an_unreadable_checkpoint_directory_is_one_error_naming_it(tmp_path, monkeypatch, mode, has_weights, fault):
    directory = make_checkpoint(tmp_path / "ckpt")
    if not has_weights:
        weights(directory).unlink()
    with unreadable(directory, mode, monkeypatch):
        with pytest.raises(CheckpointError) as caught:
            minigpt.load(str(directory))
    assert fault in str(caught.value) and str(directory) in str(caught.value)


def test_a_model_path_under_an_unsearchable_directory_is_named(tmp_path, monkeypatch):
    make_checkpoint(tmp_path / "locked" / "ckpt")
    with unreadable(tmp_path / "locked", 0o000, monkeypatch):
        with pytest.raises(CheckpointError, match=f"cannot look into the directory {tmp_path / 'locked'}"):
            minigpt.load(str(tmp_path / "locked" / "ckpt"))


def test_an_unreadable_bpe_folder_is_a_tokenizer_error_naming_it(tmp_path, monkeypatch):
    (tmp_path / "bpe").mkdir()
    monkeypatch.setenv("MINIGPT_BPE_DIR", str(tmp_path / "bpe"))
    with unreadable(tmp_path / "bpe", 0o000, monkeypatch):
        with pytest.raises(TokenizerError, match=f"cannot look into the directory {tmp_path / 'bpe'}"):
            minigpt.gpt2_tokenizer()


@pytest.mark.parametrize("make, what", [(os.mkfifo, "a FIFO"), (os.mkdir, "a directory"),
                                        (lambda p: os.symlink(p.name, p), "a symlink loop")],
                         ids=["fifo", "directory", "symlink-loop"])
def test_a_bpe_table_that_is_not_a_file_is_named_never_opened(tmp_path, monkeypatch, make, what):
    make(tmp_path / "encoder.json")
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\n")
    monkeypatch.setenv("MINIGPT_BPE_DIR", str(tmp_path))
    with pytest.raises(TokenizerError, match=f"{tmp_path / 'encoder.json'} is {what}"):
        minigpt.gpt2_tokenizer()


@pytest.mark.parametrize("make, what", [(os.mkfifo, "a FIFO"), (lambda p: p.write_bytes(b""), "a file")],
                         ids=["fifo", "file"])
def test_a_model_source_that_is_no_directory_says_what_it_is(tmp_path, make, what):
    make(tmp_path / "model")
    assert f"is {what}, not a checkpoint directory" in load_error(str(tmp_path / "model"),
                                                                           ModelNotFoundError)


# Broken BPE tables: validated before tiktoken, which would panic

def bpe_tables(directory: Path, edit, merges: int = 50000) -> Path:
    """GPT-2's encoder.json + vocab.bpe in `directory`, the vocabulary {token: id} changed by `edit`,
    the first `merges` merges kept."""
    from conftest import bpe_dir

    directory.mkdir(exist_ok=True)
    vocab = json.loads((bpe_dir() / "encoder.json").read_text(encoding="utf-8"))
    (directory / "encoder.json").write_text(json.dumps(edit(vocab)), encoding="utf-8")
    lines = (bpe_dir() / "vocab.bpe").read_text(encoding="utf-8").split("\n")
    (directory / "vocab.bpe").write_text("\n".join(lines[:1 + merges]), encoding="utf-8")
    return directory


def without_byte_a(vocab: dict) -> dict:
    """The token of the single byte "a" renamed to a multi-byte token: 50,257 tokens, one byte without one."""
    return {("aaaaaaaaaaaaaa" if token == "a" else token): i for token, i in vocab.items()}


def first_300(vocab: dict) -> dict:
    return {token: i for token, i in vocab.items() if i < 300}


@pytest.mark.parametrize("edit, merges, fault", [
    (without_byte_a, 50000, "lacks 1 of the 256 single-byte tokens (the first: byte 0x61)"),
    (first_300, 50000, "merge 44 ('Ġ l') disagrees with the vocabulary"),
    (first_300, 44, "has 300 tokens besides <|endoftext|>; GPT-2's has 50256"),
    (lambda vocab: {token: float(i) for token, i in vocab.items()}, 50000, "ids are not 0 .. n-1"),
    (lambda vocab: {**vocab, "a": vocab["b"], "b": vocab["a"]}, 50000,
     "the single-byte token of byte 0x61 has id 65, not GPT-2's 64"),
], ids=["no-single-byte-a", "merges-beyond-the-vocabulary", "a-smaller-vocabulary", "float-ids", "bytes-swapped"])
def test_broken_bpe_tables_are_a_tokenizer_error(tmp_path, monkeypatch, edit, merges, fault):
    monkeypatch.setenv("MINIGPT_BPE_DIR", str(bpe_tables(tmp_path / "bpe", edit, merges)))
    with pytest.raises(TokenizerError) as caught:
        minigpt.gpt2_tokenizer()
    assert fault in str(caught.value) and str(tmp_path / "bpe") in str(caught.value)


def test_a_checkpoints_broken_vocab_json_is_a_tokenizer_error_at_first_use(tmp_path):
    directory = make_checkpoint(tmp_path / "ckpt")
    tables = bpe_tables(tmp_path / "bpe", without_byte_a)
    (tables / "encoder.json").rename(directory / "vocab.json")
    (tables / "vocab.bpe").rename(directory / "merges.txt")
    model = minigpt.load(directory)
    with pytest.raises(TokenizerError, match="single-byte tokens"):
        minigpt.encode(model.tokenizer, "a cat")


def test_a_model_without_a_tokenizer_says_its_vocabulary_is_not_gpt2s(tmp_path):
    model = minigpt.load(make_checkpoint(tmp_path, dataclasses.replace(TINY, vocab_size=300, eos_token_id=None)))
    with pytest.raises(TokenizerError, match="vocabulary is not GPT-2's"):
        minigpt.encode(model.tokenizer, "The dog")


# Overflow inside the forward: finite weights too large for float32

def scaled(model: minigpt.Model, factor: float, only: str = "") -> minigpt.Model:
    """`model` with every weight whose name starts with `only` multiplied by `factor` (still finite)."""
    tensors = {name: value * np.float32(factor) if name.startswith(only) else value
               for name, value in params_to_tensors(model.params).items()}
    return dataclasses.replace(model, params=params_from_tensors(model.config, tensors))


OVERFLOWING_CALLS = {
    "forward": lambda model: model.forward([464, 3290]),
    "generate-greedy": lambda model: minigpt.generate(model, [464, 3290], 3),
    "generate-no-cache": lambda model: minigpt.generate(model, [464, 3290], 3, use_cache=False),
    "generate-sampled": lambda model: minigpt.generate(model, [464, 3290], 3, temperature=1.0, seed=0),
    "generate-speculative": lambda model: minigpt.generate(model, [464, 3290] * 3, 3, speculate="ngram"),
    "stream": lambda model: list(minigpt.stream(model, [464, 3290], 3, temperature=0.7, seed=0)),
    "generate_batch": lambda model: minigpt.generate_batch(model, [[464], [3290, 464]], 3),
    "score": lambda model: minigpt.score(model, [464, 3290, 13]),
    "prove": lambda model: prove(model, [464, 3290], 2),
}


@pytest.mark.parametrize("call", OVERFLOWING_CALLS)
def test_huge_finite_weights_raise_a_numerical_error_naming_the_first_block(tiny_model, call):
    with pytest.raises(NumericalError, match=r"not finite \(NaN or infinity\) after block 0 \(h\.0\)"):
        OVERFLOWING_CALLS[call](scaled(tiny_model, 1e30))


def test_the_numerical_error_names_the_first_block_that_overflowed(tiny_model):
    with pytest.raises(NumericalError, match=re.escape("after block 1 (h.1)")):
        scaled(tiny_model, 1e30, "h.1.").forward([464, 3290])


@pytest.mark.parametrize("run", ["generate_batch", "engine"])
def test_an_overflow_in_a_batch_names_the_prompt_that_overflowed_and_its_first_layer(tiny_model, run):
    """Prompts 0 and 2 stay short of position 8; prompt 1 reaches it: the error names prompt 1 and
    block 0, as a forward over prompt 1 alone does."""
    model, prompts = with_huge_position(tiny_model, 8), [[464, 3290], list(range(9)), [13]]
    with pytest.raises(NumericalError, match=re.escape("after block 0 (h.0)")):
        model.forward(prompts[1])
    call = (lambda: minigpt.generate_batch(model, prompts, 3, stop_at_eos=False)) if run == "generate_batch" else (
        lambda: minigpt.Engine(model).generate(prompts, 3, stop_at_eos=False))
    with pytest.raises(NumericalError, match=r"^prompt 1: .*not finite .* after block 0 \(h\.0\)") as raised:
        call()
    assert raised.value.prompt == 1


def test_the_numerical_error_names_the_lm_head_when_only_the_logits_overflow(tiny_model):
    """ln_f outputs 1e37 everywhere, finite; token 0's row of wte sums to 64: its logit is 6.4e38."""
    tensors = params_to_tensors(tiny_model.params)
    tensors["ln_f.weight"] = np.zeros(64, np.float32)
    tensors["ln_f.bias"] = np.full(64, 1e37, np.float32)
    tensors["wte.weight"] = tensors["wte.weight"].copy()
    tensors["wte.weight"][0] = 1
    model = dataclasses.replace(tiny_model, params=params_from_tensors(tiny_model.config, tensors))
    with pytest.raises(NumericalError, match=re.escape("after the LM head (the logits, wte)")):
        model.forward([464, 3290])


def test_an_overflowing_forward_leaves_the_cache_as_it_was(tiny_model):
    """Its length is unchanged, and continuing it gives bitwise the logits of an untouched cache."""
    cache, untouched = tiny_model.new_cache(), tiny_model.new_cache()
    tiny_model.forward([464, 3290], cache)
    tiny_model.forward([464, 3290], untouched)
    with pytest.raises(NumericalError):
        scaled(tiny_model, 1e30, "h.1.").forward([13, 14], cache)
    assert cache.length == 2
    assert_continues_alike(tiny_model, cache, untouched)


def assert_continues_alike(model, cache, untouched):
    a, b = model.forward([13, 14, 15], cache), model.forward([13, 14, 15], untouched)
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))


# Objects from another model

def model_of(**sizes) -> minigpt.Model:
    config = GPT2Config(**{**dict(vocab_size=50257, n_positions=32, n_embd=8, n_layer=1, n_head=2), **sizes})
    return minigpt.Model(config, random_params(config))


@pytest.mark.parametrize("other, names", [
    (dict(n_layer=2), ["n_layer 2 (this model: 1)"]),
    (dict(n_head=4), ["n_head 4 (this model: 2)", "head_dim 2 (this model: 4)"]),
    (dict(n_embd=16, n_head=2), ["head_dim 8 (this model: 4)"]),
    (dict(n_positions=64), ["holds 64 positions", "context of 32"]),
], ids=["n_layer", "n_head", "head_dim", "capacity"])
def test_a_cache_from_another_model_is_refused_naming_what_does_not_fit(no_work, other, names):
    model, cache = model_of(), model_of(**other).new_cache()
    for call in (lambda: model.forward([464], cache), lambda: model.forward_batch([[464]], [cache])):
        with pytest.raises(InputError) as caught:
            call()
        assert all(name in str(caught.value) for name in names), caught.value
        assert cache.length == 0


@pytest.mark.parametrize("cache, fault", [
    ({"k": None}, "must be a KVCache"),
    (minigpt.KVCache(np.zeros((1, 16, 2, 4)), np.zeros((1, 16, 2, 4))), "float32 array"),
    (PagedCache(PagePool(model_of().config, 1), [1]), "page table"),
    (minigpt.KVCache(np.zeros((1, 2, 16, 4), np.float32), np.zeros((1, 2, 16, 4), np.float32), 17), "length 17"),
], ids=["not-a-cache", "float64-store", "page-outside-store", "length-past-capacity"])
def test_a_cache_that_is_not_one_is_refused(no_work, cache, fault):
    with pytest.raises(InputError, match=fault):
        model_of().forward([464], cache)


@pytest.mark.parametrize("capacity, fault", [
    (-5, "capacity must be an integer >= 1, got -5"),
    (0, "capacity must be an integer >= 1, got 0"),
    (2.5, "capacity must be an integer >= 1, got 2.5"),
    (True, "capacity must be an integer >= 1, got True"),
    (10**12, "at most the model's context of 256 positions (n_positions), got 1000000000000"),
])
def test_new_cache_takes_only_a_capacity_within_the_context(tiny_model, capacity, fault):
    with pytest.raises(InputError, match=re.escape(fault)):
        tiny_model.new_cache(capacity)


# What load, the sampling options and the pool accept

@pytest.mark.parametrize("source", [None, 123, b"random-tiny", ["random-tiny"]])
def test_only_a_str_or_path_names_a_model(source):
    message = load_error(source, InputError)
    assert "must be a str or os.PathLike" in message and type(source).__name__ in message


def test_a_path_object_names_a_model(tmp_path):
    assert minigpt.load(make_checkpoint(tmp_path)).config == TINY


@pytest.mark.parametrize("name", ["random-tiny", "gpt2"])
def test_an_existing_local_directory_wins_over_every_name(tmp_path, monkeypatch, name):
    """The one rule: a local directory of that name is loaded, whether the name is embedded or a hub alias."""
    make_checkpoint(tmp_path / name)
    monkeypatch.chdir(tmp_path)
    assert minigpt.load(name).config == TINY


@pytest.mark.parametrize("options, option", [
    (dict(temperature=Fraction(1, 2)), "temperature"),
    (dict(temperature=Decimal("0.5")), "temperature"),
    (dict(temperature=True), "temperature"),
    (dict(top_p=Fraction(1, 2)), "top_p"),
    (dict(top_p=np.bool_(True)), "top_p"),
    (dict(top_k=Fraction(2, 1)), "top_k"),
], ids=["temperature-fraction", "temperature-decimal", "temperature-bool", "top_p-fraction", "top_p-numpy-bool",
        "top_k-fraction"])
def test_a_number_numpy_cannot_compute_with_is_refused(tiny_model, no_work, options, option):
    for call in (lambda: minigpt.generate(tiny_model, [464], 1, **options),
                 lambda: minigpt.generate_batch(tiny_model, [[464]], 1, **options)):
        with pytest.raises(InputError, match=option):
            call()


def test_numpy_scalars_are_numbers(tiny_model):
    result = minigpt.generate(tiny_model, [464], 2, temperature=np.float32(0.5), top_p=np.float64(0.9),
                              top_k=np.int64(5), seed=np.uint8(3))
    assert result.tokens == minigpt.generate(tiny_model, [464], 2, temperature=0.5, top_p=0.9, top_k=5, seed=3).tokens




def test_a_number_beyond_float64_is_refused_before_numpy_overflows(tiny_model, no_work):
    """10**400 is an int, so it compares fine with infinity, and then overflows inside NumPy."""
    for call in (lambda: minigpt.generate(tiny_model, [464], 1, temperature=10**400),
                 lambda: minigpt.generate_batch(tiny_model, [[464]], 1, temperature=[10**400])):
        with pytest.raises(InputError, match="temperature must be a finite number >= 0, got 1000"):
            call()


HUGE = 10 ** 5000  # more digits than Python prints (4,300): repr and str raise ValueError


@pytest.mark.parametrize("call, option", [
    (lambda model: minigpt.generate(model, [464], HUGE), "beyond the context"),
    (lambda model: minigpt.generate(model, [464], 1, top_logprobs=HUGE), "top_logprobs must be an integer"),
    (lambda model: minigpt.generate(model, [464], 1, temperature=1, seed=-HUGE), "seed must be an integer"),
    (lambda model: minigpt.generate(model, [464], 1, temperature=HUGE), "temperature must be a finite number"),
    (lambda model: minigpt.generate(model, [464], 1, use_cache=HUGE), "use_cache must be True or False"),
    (lambda model: minigpt.generate(model, [464, HUGE], 1), "token id "),
    (lambda model: minigpt.generate_batch(model, [[464]], 1, kv_cache_tokens=-HUGE), "kv_cache_tokens must be"),
    (lambda model: minigpt.score(model, [464, 464], HUGE), "stride must be an integer"),
    (lambda model: model.new_cache(HUGE), "capacity must be at most"),
], ids=["max_new_tokens", "top_logprobs", "seed", "temperature", "use_cache", "id", "kv_cache_tokens", "stride",
        "capacity"])
def test_an_integer_too_long_to_print_is_named_by_its_size_not_a_value_error(tiny_model, no_work, call, option):
    with pytest.raises(InputError) as caught:
        call(tiny_model)
    assert option in str(caught.value) and "an integer of about 5,000 digits" in str(caught.value)


def test_a_stop_list_is_shown_abridged_in_its_error(tiny_model, no_work):
    with pytest.raises(InputError) as caught:
        minigpt.generate(tiny_model, [464], 1, stop=["\udcff" * 100_000])
    assert len(str(caught.value)) < 100  # not the 100,000 characters


# Arguments of the wrong type, to every public function

def other_model() -> minigpt.Model:
    return model_of(n_layer=2)  # n_embd 8: random-tiny's config with these weights does not fit


WRONG_TYPES = {  # the call, what the InputError must say
    "generate-a-name": (lambda m: minigpt.generate("random-tiny", [464], 1),
                        "model must be a minigpt.Model, got str 'random-tiny': load it first"),
    "stream-none": (lambda m: minigpt.stream(None, [464], 1), "model must be a minigpt.Model, got NoneType"),
    "generate_batch-a-name": (lambda m: minigpt.generate_batch("random-tiny", [], 1), "got str 'random-tiny'"),
    "score-a-path": (lambda m: minigpt.score(Path("x"), [464, 13]), "load it first"),
    "Model-config-none": (lambda m: minigpt.Model(None, m.params), "config must be a GPT2Config, got NoneType"),
    "Model-weights-of-another-model": (lambda m: minigpt.Model(m.config, other_model().params),
                                       "tensor 'wte.weight' is ndarray float32 [50257, 8], expected float32 "
                                       "[50257, 64]"),
    "Model-weights-of-another-config": (lambda m: minigpt.Model(m.config, model_of(n_layer=1).params),
                                        "the weights have 1 layer(s) and the config 2 (n_layer)"),
    "Model-float64-weights": (lambda m: minigpt.Model(m.config, dataclasses.replace(
        m.params, wpe=m.params.wpe.astype(np.float64))), "'wpe.weight' is ndarray float64 [256, 64], expected float32"),
    "Model-kernels-a-name": (lambda m: minigpt.Model(m.config, m.params, "fast"), "kernels must be a kernel set"),
    "use_cache-a-string": (lambda m: minigpt.generate(m, [464], 1, use_cache="no"),
                           "use_cache must be True or False, got 'no'"),
    "stop_at_eos-none": (lambda m: minigpt.generate_batch(m, [[464]], 1, stop_at_eos=None),
                         "stop_at_eos must be True or False, got None"),
    "truncate_prompt-an-int": (lambda m: minigpt.stream(m, [464], 1, truncate_prompt=1),
                               "truncate_prompt must be True or False, got 1"),
    "on_step-an-int": (lambda m: minigpt.generate(m, [464], 1, on_step=5), "on_step must be a function or None"),
    "forward_batch-a-generator": (lambda m: m.forward_batch((ids for ids in [[464]]), [None]),
                                  "a list of id sequences and a list of caches, got generator and list"),
    "forward_batch-one-cache-twice": (lambda m: m.forward_batch([[464], [13]], [c := m.new_cache(), c]),
                                      "the same cache for two sequences"),
}


@pytest.mark.parametrize("call", WRONG_TYPES)
def test_an_argument_of_the_wrong_type_is_an_input_error_naming_it(tiny_model, no_work, call):
    """Never an AttributeError or a NumPy error from inside, never silently taken for another value."""
    make, message = WRONG_TYPES[call]
    with pytest.raises(InputError) as caught:
        result = make(tiny_model)
        list(result) if call.startswith("stream") else None
    assert message in str(caught.value)


@pytest.mark.parametrize("text, message", [(b"The dog", "got bytes; decode the bytes first"), (None, "got NoneType")])
def test_encode_takes_text_and_a_tokenizer(tiny_model, tokenizer, text, message):
    with pytest.raises(InputError, match=re.escape(message)):
        minigpt.encode(tokenizer, text)
    with pytest.raises(InputError, match=re.escape("a tokenizer (model.tokenizer), got Model")):
        minigpt.encode(tiny_model, "The dog")


@pytest.mark.parametrize("store, fault", [
    ("shared", "k and v stores share memory"),
    ("read-only", "writable float32 array"),
    ("a-page-twice", "holds a page twice"),
])
def test_a_cache_whose_store_cannot_hold_keys_and_values_is_refused(no_work, store, fault):
    """Each would be a silent wrong answer (values over keys, two positions in one slot) or a NumPy error."""
    k, v = np.zeros((1, 32, 2, 4), np.float32), np.zeros((1, 32, 2, 4), np.float32)
    if store == "shared":
        cache = minigpt.KVCache(k, k)
    elif store == "read-only":
        k.setflags(write=False)
        cache = minigpt.KVCache(k, v)
    else:
        cache = PagedCache(PagePool(model_of().config, 2), [0, 0])
    with pytest.raises(InputError, match=fault):
        model_of().forward([464], cache)


def test_a_ctrl_c_while_an_overflow_is_traced_leaves_the_cache_as_it_was(tiny_model, monkeypatch):
    """After an overflow, Model.forward traces the forward again on the cache to name the layer; a
    Ctrl-C during that trace leaves the cache's length as it was, and the cache continues bitwise."""
    t = {n: v * np.float32(1e30) if n.startswith("h.1.mlp.") else v
         for n, v in params_to_tensors(tiny_model.params).items()}
    huge = dataclasses.replace(tiny_model, params=params_from_tensors(tiny_model.config, t))
    cache, untouched = tiny_model.new_cache(), tiny_model.new_cache()
    tiny_model.forward([464, 3290], cache)
    tiny_model.forward([464, 3290], untouched)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(minigpt.exact.tracing, "lm_head", interrupted)
    with pytest.raises(KeyboardInterrupt), np.errstate(over="ignore", invalid="ignore"):
        huge.forward([13, 14], cache)
    monkeypatch.undo()
    assert cache.length == 2
    assert_continues_alike(tiny_model, cache, untouched)


def test_page_numbers_of_a_small_numpy_integer_type_point_at_their_own_pages(tiny_model):
    """A page table of np.uint8 page numbers: page 20 is page 20 (20 * 16 does not wrap to page 4's
    slots), so the sequence on page 4 is untouched and both continue bitwise as fresh ones."""
    pool = PagePool(tiny_model.config, 32)
    other, mine = PagedCache(pool, [4]), PagedCache(pool, [np.uint8(20)])
    pool.free[[4, 20]] = False
    pool.refs[[4, 20]] = 1
    tiny_model.forward(list(range(100, 110)), other)
    got = tiny_model.forward(list(range(200, 212)), mine)
    fresh = tiny_model.forward(list(range(200, 212)))
    np.testing.assert_array_equal(got.view(np.uint32), fresh.view(np.uint32))
    expected = tiny_model.forward(list(range(100, 110)) + [7], logits_to_keep=1)
    np.testing.assert_array_equal(tiny_model.forward([7], other).view(np.uint32), expected.view(np.uint32))


@pytest.mark.parametrize("paged", [False, True], ids=["cache", "paged-cache"])
def test_a_forward_interrupted_midway_leaves_the_cache_as_it_was(tiny_model, monkeypatch, paged):
    """Ctrl-C after block 0 wrote the new keys and values: the cache's length is unchanged, and
    continuing it gives bitwise the logits of an untouched cache (no kernel reads past the length)."""
    def new():
        if not paged:
            return tiny_model.new_cache()
        pool = PagePool(tiny_model.config, 2)
        cache = PagedCache(pool)
        pool.grow(cache, 32)
        return cache

    cache, untouched = new(), new()
    tiny_model.forward([464, 3290], cache)
    tiny_model.forward([464, 3290], untouched)
    real_block, blocks = minigpt.cache.kv_cache.block, []

    def block(*args):
        blocks.append(1)
        if len(blocks) == 2:
            raise KeyboardInterrupt
        return real_block(*args)

    for module in (minigpt.cache.kv_cache, minigpt.exact.batched):
        monkeypatch.setattr(module, "block", block)
    with pytest.raises(KeyboardInterrupt):
        tiny_model.forward([13, 14], cache)
    monkeypatch.undo()
    assert cache.length == 2
    assert_continues_alike(tiny_model, cache, untouched)


def test_bpe_tables_nested_too_deeply_are_a_tokenizer_error(tmp_path, monkeypatch):
    (tmp_path / "encoder.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "vocab.bpe").write_text("#version: 0.2\n")
    monkeypatch.setenv("MINIGPT_BPE_DIR", str(tmp_path))
    with pytest.raises(TokenizerError, match="cannot use the GPT-2 BPE tables"):
        minigpt.gpt2_tokenizer()
