"""GPT-2's byte-pair encoding, through tiktoken.

GPT-2's BPE tables ship inside the package (minigpt/gpt2_bpe/), so tokenizing never needs the
network; a checkpoint's or MINIGPT_BPE_DIR's tables come first (docs/tokenizer.md). They are read
here, as the files stand: tiktoken's loader would cache a copy by path and miss a changed file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import tiktoken
from tiktoken_ext.openai_public import r50k_pat_str

from ..errors import InputError, TokenizerError, check_bool
from ..gpt2.config import GPT2_VOCAB_SIZE
from .files import is_file

ENDOFTEXT = "<|endoftext|>"
# (merges file, token -> id file) as tiktoken's download names them and as the hub repos do.
BPE_FILE_PAIRS = (("vocab.bpe", "encoder.json"), ("merges.txt", "vocab.json"))
PACKAGED_BPE = Path(__file__).resolve().parents[1] / "gpt2_bpe"
# The packaged tables' SHA-256, the hashes tiktoken pins for its download of the same two files.
PACKAGED_SHA256 = {"vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
                   "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"}


def find_bpe_files(directory: str | Path) -> tuple[Path, Path] | None:
    """The (merges, vocabulary) pair in `directory`, if it holds one."""
    for merges, vocab in BPE_FILE_PAIRS:
        m, v = Path(directory) / merges, Path(directory) / vocab
        if is_file(m, TokenizerError) and is_file(v, TokenizerError):
            return m, v
    return None


def byte_decoder() -> dict[str, int]:
    """GPT-2's tables spell bytes as printable characters: this maps each character back to its byte.

    Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, ...) are spelled, in
    byte order, by the characters from chr(256) on.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}


def read_ranks(merges: Path, vocab: Path) -> dict[bytes, int]:
    """token bytes -> id from the vocabulary, checked against the merges (merge i makes token 256 + i)
    and against what tiktoken needs: ids 0 .. n-1, each of the 256 bytes at GPT-2's id for it, and
    GPT-2's size."""
    decode = byte_decoder()
    table = json.loads(vocab.read_text(encoding="utf-8"))
    ranks = {bytes(decode[c] for c in token): rank for token, rank in table.items() if token != ENDOFTEXT}
    lines = merges.read_text(encoding="utf-8").split("\n")[1:]  # after the "#version" line
    for i, merge in enumerate(line for line in lines if line):
        first, second = merge.split(" ")
        if table.get(first + second) != 256 + i:
            raise ValueError(f"merge {i} ({merge!r}) disagrees with the vocabulary")
    if any(type(rank) is not int for rank in ranks.values()) or sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("the vocabulary's ids are not 0 .. n-1")
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise ValueError(f"the vocabulary lacks {len(missing)} of the 256 single-byte tokens (the first: byte "
                         f"{missing[0]:#04x}), so text holding such a byte cannot be encoded")
    for i, b in enumerate(decode.values()):  # GPT-2's ids 0 .. 255 are the bytes in byte_decoder's order
        if ranks[bytes([b])] != i:
            raise ValueError(f"the single-byte token of byte {b:#04x} has id {ranks[bytes([b])]}, not GPT-2's {i}: "
                             "the model would read other bytes than the text's")
    if len(ranks) != GPT2_VOCAB_SIZE - 1:
        raise ValueError(f"the vocabulary has {len(ranks)} tokens besides {ENDOFTEXT}; "
                         f"GPT-2's has {GPT2_VOCAB_SIZE - 1}")
    return ranks


def encoding_from_files(merges: Path, vocab: Path) -> tiktoken.Encoding:
    """tiktoken's GPT-2 encoding built from local BPE tables."""
    try:
        ranks = read_ranks(merges, vocab)
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as e:  # [[[[... too deep
        raise TokenizerError(f"cannot use the GPT-2 BPE tables {merges} and {vocab}: {e}") from None
    return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                             special_tokens={ENDOFTEXT: len(ranks)})


def packaged_tables() -> tuple[Path, Path]:
    """The (merges, vocabulary) tables shipped in the package, their SHA-256 checked: a damaged or
    edited install is refused by name, never tokenized with."""
    for name, expected in PACKAGED_SHA256.items():
        path = PACKAGED_BPE / name
        try:
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError as e:
            raise TokenizerError(f"cannot read minigpt's packaged BPE table {path}: {e.strerror or e}; "
                                 "reinstall minigpt") from None
        if digest != expected:
            raise TokenizerError(f"minigpt's packaged BPE table {path} is not GPT-2's: its SHA-256 is {digest}, "
                                 f"not {expected}; reinstall minigpt")
    return PACKAGED_BPE / "vocab.bpe", PACKAGED_BPE / "encoder.json"


def gpt2_tokenizer(directory: str | Path | None = None) -> tiktoken.Encoding:
    """GPT-2's encoding from `directory`'s tables if it has them, else from `MINIGPT_BPE_DIR`'s, else
    from the tables packaged with minigpt: never a download."""
    if directory is not None and not isinstance(directory, (str, os.PathLike)):
        raise InputError(f"directory must be a str or os.PathLike, got {type(directory).__name__}")
    if directory is not None and (files := find_bpe_files(directory)):
        return encoding_from_files(*files)
    if folder := os.environ.get("MINIGPT_BPE_DIR"):
        if files := find_bpe_files(folder):
            return encoding_from_files(*files)
        raise TokenizerError(f"MINIGPT_BPE_DIR is {folder!r}, which holds neither "
                             + " nor ".join(f"{v} + {m}" for m, v in BPE_FILE_PAIRS))
    return encoding_from_files(*packaged_tables())


def token_text(tokenizer: tiktoken.Encoding, token: int) -> str:
    """One token's text on its own (a byte that only begins a character decodes as U+FFFD)."""
    return tokenizer.decode_single_token_bytes(token).decode("utf-8", errors="replace")


# Bytes that are not UTF-8, as Python keeps them in a str (sys.argv, os.fsdecode: errors="surrogateescape").
SURROGATE_ESCAPES = re.compile("([\udc80-\udcff]+)")


def no_tokenizer(vocab_size: int) -> str:
    """Why text cannot be encoded for a model whose vocabulary is not GPT-2's (model.tokenizer is None)."""
    return (f"this model's vocabulary has {vocab_size} tokens, not GPT-2's {GPT2_VOCAB_SIZE}, "
            "so it has no tokenizer for text")


def encode(tokenizer: tiktoken.Encoding, text: str, *, special_tokens: bool = True) -> list[int]:
    """Encode text. A literal "<|endoftext|>" is the special token, as Hugging Face's tokenizer
    makes it (special_tokens=False: ordinary text). Undecodable bytes carried as surrogate escapes
    (a command line's) are encoded as themselves, where tiktoken alone would give U+FFFD."""
    if tokenizer is None:  # `model.tokenizer` of a model whose vocabulary is not GPT-2's
        raise TokenizerError("no tokenizer (None): the model's vocabulary is not GPT-2's, so it has no tokenizer "
                             "for text; give it token ids")
    if not isinstance(tokenizer, tiktoken.Encoding):
        raise InputError(f"encode takes a tokenizer (model.tokenizer), got {type(tokenizer).__name__}")
    if not isinstance(text, str):
        raise InputError(f"encode takes text (a str), got {type(text).__name__}"
                         + ("; decode the bytes first" if isinstance(text, (bytes, bytearray)) else ""))
    check_bool(special_tokens, "special_tokens")
    documents = text.split(ENDOFTEXT) if special_tokens else [text]
    ids = []
    for n, document in enumerate(documents):
        if n:
            ids.append(tokenizer.eot_token)  # between two documents
        for i, part in enumerate(SURROGATE_ESCAPES.split(document)):  # text, escaped bytes, text, ...
            if i % 2:
                ids += [tokenizer.encode_single_token(bytes([b])) for b in part.encode("utf-8", "surrogateescape")]
            elif part:
                ids += tokenizer.encode(part, disallowed_special=())
    return ids


def valid_text(text: str) -> str:
    """`text` as valid Unicode: its surrogate escapes decoded as UTF-8 decoders do bad bytes, and any
    other lone surrogate, to U+FFFD. What `tokenizer.decode(encode(tokenizer, text))` gives back."""
    return "".join(part.encode("utf-8", "surrogateescape").decode("utf-8", "replace") if i % 2
                   else part.encode("utf-16", "surrogatepass").decode("utf-16", "replace")  # as tiktoken does
                   for i, part in enumerate(SURROGATE_ESCAPES.split(text)))
