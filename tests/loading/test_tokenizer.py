"""GPT-2's tokenizer: tiktoken's own gpt2 ids, and decode(encode(s)) == s for any text.

`tiktoken.get_encoding("gpt2")` downloads its tables, which tests never do. The reference here is
built by tiktoken's own recipe, `tiktoken_ext.openai_public.gpt2()`, with only its two download URLs
redirected to the local files; tiktoken then checks the SHA-256 hashes it pins for them, so these
tests also prove that the local tables are the real ones.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import tiktoken
import tiktoken.load
import tiktoken.registry
from conftest import bpe_dir
from hypothesis import given
from hypothesis import strategies as st
from tiktoken_ext import openai_public

import minigpt
from minigpt.errors import TokenizerError
import minigpt.loading.tokenizer
from minigpt.loading.tokenizer import (ENDOFTEXT, PACKAGED_BPE, PACKAGED_SHA256, find_bpe_files, gpt2_tokenizer,
                              valid_text)

EOT = 50256
# The regex's cases (contractions, letters, digits, other, whitespace runs) and the special token's text.
PIECES = ["The", " dog", "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", " 123", "4567", "!?", " ", "   ",
          "\n", "\n\n", "\r\n", "\t", "\u00a0", "é", "日本語", " 🙂", "\u200d", ENDOFTEXT, "<|", "|>"]
TEXTS = st.text() | st.lists(st.sampled_from(PIECES) | st.text(max_size=3), max_size=12).map("".join)


@pytest.fixture(scope="session")
def tables():
    """(merges, vocabulary) files of GPT-2's tables as packaged with minigpt (session-scoped: found
    before `offline` hides MINIGPT_BPE_DIR)."""
    return find_bpe_files(bpe_dir())


@pytest.fixture(scope="session")
def reference(tables, tmp_path_factory) -> tiktoken.Encoding:
    """tiktoken's gpt2 Encoding made by openai_public.gpt2() from the local files, its hashes checked."""
    build = openai_public.data_gym_to_mergeable_bpe_ranks

    merges, vocab = tables  # vocab.bpe or merges.txt, encoder.json or vocab.json: the same bytes

    def from_local_files(vocab_bpe_file, encoder_json_file, vocab_bpe_hash, encoder_json_hash):
        assert vocab_bpe_hash and encoder_json_hash, "tiktoken no longer pins the gpt2 hashes"
        return build(vocab_bpe_file=str(merges), encoder_json_file=str(vocab),
                     vocab_bpe_hash=vocab_bpe_hash, encoder_json_hash=encoder_json_hash)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(openai_public, "data_gym_to_mergeable_bpe_ranks", from_local_files)
        # An empty cache: tiktoken hashes the files themselves (with caching off it would not hash at all).
        mp.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path_factory.mktemp("tiktoken-cache")))
        return tiktoken.Encoding(**openai_public.gpt2())


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No MINIGPT_BPE_DIR, an empty tiktoken cache, no tiktoken encodings in memory, and no network
    (tiktoken's downloads fail)."""
    monkeypatch.delenv("MINIGPT_BPE_DIR", raising=False)
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path / "tiktoken-cache"))
    monkeypatch.setattr(tiktoken.registry, "ENCODINGS", {})
    read_file = tiktoken.load.read_file

    def local_only(blobpath: str) -> bytes:
        if "://" in blobpath:
            raise ConnectionError(f"the test is offline: {blobpath}")
        return read_file(blobpath)

    monkeypatch.setattr(tiktoken.load, "read_file", local_only)


@pytest.fixture
def hub_layout(tables, tmp_path):
    """A directory with GPT-2's tables under the names the hub's checkpoints use: vocab.json, merges.txt."""
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    merges, vocab = tables
    shutil.copyfile(vocab, directory / "vocab.json")
    shutil.copyfile(merges, directory / "merges.txt")
    return directory


def token_bytes(encoding: tiktoken.Encoding) -> list[bytes]:
    return [encoding.decode_single_token_bytes(i) for i in range(encoding.n_vocab)]


def test_the_vocabulary_is_tiktokens_gpt2(tokenizer, reference):
    """The same 50,257 tokens, each the same bytes, and <|endoftext|> = 50256 as the only special token."""
    assert tokenizer.n_vocab == reference.n_vocab == 50257
    assert tokenizer.special_tokens_set == reference.special_tokens_set == {ENDOFTEXT}
    assert tokenizer.eot_token == reference.eot_token == EOT
    assert token_bytes(tokenizer) == token_bytes(reference)


@pytest.mark.parametrize(("text", "ids"), [("The dog", [464, 3290]), ("Hello world", [15496, 995]),
                                           ("hello world", [31373, 995])])
def test_known_ids(tokenizer, reference, text, ids):
    assert minigpt.encode(tokenizer, text) == reference.encode(text) == ids


@given(text=TEXTS)
def test_any_text_encodes_as_tiktoken_gpt2_and_round_trips(tokenizer, reference, text):
    """Property: for any Unicode text, the ids are tiktoken gpt2's (<|endoftext|> as the special token,
    or with special_tokens=False as plain text) and decoding them gives the text back."""
    ids = minigpt.encode(tokenizer, text)
    assert ids == reference.encode(text, allowed_special="all")
    assert tokenizer.decode(ids) == text
    ordinary = minigpt.encode(tokenizer, text, special_tokens=False)
    assert ordinary == reference.encode_ordinary(text)
    assert tokenizer.decode(ordinary) == text


@given(st.binary(max_size=40) | st.lists(st.sampled_from([b"\xff", b"\xe4\xb8", b"\xc3\xa9", b" dog", b"\x00"]),
                                        max_size=10).map(b"".join))
def test_undecodable_bytes_carried_as_surrogate_escapes_are_encoded_as_themselves(tokenizer, data):
    """Property: for any bytes, as Python hands them over in a str (sys.argv: errors="surrogateescape"),
    the ids spell exactly those bytes; and the valid text shown for them is what the ids decode to."""
    text = data.decode("utf-8", errors="surrogateescape")
    ids = minigpt.encode(tokenizer, text)
    assert tokenizer.decode_bytes(ids) == data
    assert tokenizer.decode(ids) == valid_text(text) == data.decode("utf-8", errors="replace")


@given(st.text(st.characters() | st.integers(0xD800, 0xDFFF).map(chr)))
def test_any_lone_surrogate_encodes_without_error_and_decodes_as_valid_text(tokenizer, text):
    """Property: text holding any surrogates (escapes or not, paired or lone) encodes, and decodes to
    valid_text(text), which is valid Unicode."""
    decoded = tokenizer.decode(minigpt.encode(tokenizer, text))
    assert decoded == valid_text(text)
    decoded.encode("utf-8")  # strict: no surrogate left


@pytest.mark.parametrize("text", [ENDOFTEXT, f"The dog{ENDOFTEXT}", f"{ENDOFTEXT}\n{ENDOFTEXT} end"])
def test_a_literal_endoftext_is_the_special_token_unless_special_tokens_is_false(tokenizer, reference, text):
    """"<|endoftext|>" in text is 50256 wherever it stands, each document around it encoded on its own;
    with special_tokens=False, its characters, as tiktoken's encode_ordinary does. Both decode back."""
    ids = minigpt.encode(tokenizer, text)
    assert ids.count(EOT) == text.count(ENDOFTEXT)
    assert ids == reference.encode(text, allowed_special={ENDOFTEXT})
    ordinary = minigpt.encode(tokenizer, text, special_tokens=False)
    assert EOT not in ordinary and ordinary == reference.encode_ordinary(text)
    assert tokenizer.decode(ids) == tokenizer.decode(ordinary) == text


def test_special_tokens_must_be_a_bool(tokenizer):
    from minigpt.errors import InputError

    with pytest.raises(InputError, match="special_tokens must be True or False, got 'no'"):
        minigpt.encode(tokenizer, "a", special_tokens="no")


def test_a_hub_layout_directory_gives_the_same_encoding(tokenizer, hub_layout, offline):
    """vocab.json + merges.txt, as in a Hugging Face checkpoint, give the same tokenizer as the shared folder."""
    from_hub_layout = gpt2_tokenizer(hub_layout)
    assert token_bytes(from_hub_layout) == token_bytes(tokenizer)
    text = "The dog's 3 toys, naïvely \n\n sorted🙂"
    assert minigpt.encode(from_hub_layout, text) == minigpt.encode(tokenizer, text)


def test_without_other_tables_the_packaged_ones_are_used_offline(reference, offline, tmp_path):
    """Neither a directory with tables, nor MINIGPT_BPE_DIR, nor tiktoken's cache, nor the network: the
    tables shipped in the package give tiktoken's gpt2 tokens."""
    for directory in (None, tmp_path):
        assert token_bytes(gpt2_tokenizer(directory)) == token_bytes(reference)


@pytest.mark.parametrize("damage", [lambda data: data[:99] + bytes([data[99] ^ 1]) + data[100:], lambda data: data[:-1]],
                         ids=["a-byte-changed", "cut-short"])
def test_packaged_tables_that_are_not_gpt2s_are_a_tokenizer_error(offline, tmp_path, monkeypatch, damage):
    """The packaged tables are checked against their SHA-256 when read: a damaged install is named."""
    for name in PACKAGED_SHA256:
        shutil.copyfile(PACKAGED_BPE / name, tmp_path / name)
    (tmp_path / "encoder.json").write_bytes(damage((tmp_path / "encoder.json").read_bytes()))
    monkeypatch.setattr(minigpt.loading.tokenizer, "PACKAGED_BPE", tmp_path)
    with pytest.raises(TokenizerError, match=f"packaged BPE table {tmp_path / 'encoder.json'} is not GPT-2's: "
                                             "its SHA-256 is [0-9a-f]{64}, not 1961.*; reinstall minigpt"):
        gpt2_tokenizer()


def test_tables_are_read_as_they_are_now(hub_layout, offline):
    """Tables that changed after a first load are read anew: here, damaged, they must raise TokenizerError."""
    gpt2_tokenizer(hub_layout)
    (hub_layout / "vocab.json").write_text("not JSON")
    with pytest.raises(TokenizerError):
        gpt2_tokenizer(hub_layout)


def test_a_checkpoint_with_another_vocabulary_gets_no_tokenizer_and_text_is_refused(capsys):
    """GPT-2's tokenizer is attached only to GPT-2's vocabulary; text for another one is an error."""
    import minigpt
    from minigpt.cli import main

    directory = Path(__file__).parents[1] / "fixtures" / "float32"
    model = minigpt.load(directory)
    assert model.config.vocab_size != 50257 and model.tokenizer is None
    assert main(["generate", "hello", "--model", str(directory)]) == 1
    assert capsys.readouterr().err == (f"error: this model's vocabulary has {model.config.vocab_size} tokens, "
                                      "not GPT-2's 50257, so it has no tokenizer for text\n")


def test_a_bpe_folder_without_the_tables_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIGPT_BPE_DIR", str(tmp_path))
    with pytest.raises(TokenizerError, match=f"MINIGPT_BPE_DIR is '{tmp_path}', which holds neither"):
        gpt2_tokenizer()


def test_an_embedded_model_loads_without_the_tables_and_tokenizes_on_first_use(tmp_path, monkeypatch):
    """Loading never reads GPT-2's BPE tables; the tokenizer is built when first needed, by
    `model.tokenizer` or by a generation (its result carries its text), and unusable tables fail there."""
    monkeypatch.setenv("MINIGPT_BPE_DIR", str(tmp_path))
    model = minigpt.load("random-tiny")  # no tokenizer needed
    with pytest.raises(TokenizerError):
        model.tokenizer
    with pytest.raises(TokenizerError):
        minigpt.generate(model, [464, 3290], 3)
    monkeypatch.delenv("MINIGPT_BPE_DIR")
    model = minigpt.load("random-tiny")
    assert model.tokenizer.encode("The dog") == [464, 3290]
    result = minigpt.generate(model, [464, 3290], 3)
    assert result.text == model.tokenizer.decode(result.tokens)
