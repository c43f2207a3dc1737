"""GPT-2's byte-pair encoding, through tiktoken.

tiktoken normally downloads GPT-2's two BPE tables (`encoder.json`, `vocab.bpe`) once and caches
them. Hugging Face checkpoints carry the same tables as `vocab.json` + `merges.txt`, so a
downloaded checkpoint tokenizes offline; `MINIGPT_BPE_DIR` can name a folder holding either pair.
"""

from __future__ import annotations

import os
from pathlib import Path

import tiktoken
import tiktoken.load
from tiktoken_ext.openai_public import r50k_pat_str

from .errors import TokenizerError

ENDOFTEXT = "<|endoftext|>"
# (merges file, token -> id file) as tiktoken's download names them and as the hub repos do.
BPE_FILE_PAIRS = (("vocab.bpe", "encoder.json"), ("merges.txt", "vocab.json"))


def find_bpe_files(directory: str | Path) -> tuple[Path, Path] | None:
    """The (merges, vocabulary) pair in `directory`, if it holds one."""
    for merges, vocab in BPE_FILE_PAIRS:
        m, v = Path(directory) / merges, Path(directory) / vocab
        if m.is_file() and v.is_file():
            return m, v
    return None


def encoding_from_files(merges: Path, vocab: Path) -> tiktoken.Encoding:
    """tiktoken's GPT-2 encoding built from local BPE tables."""
    try:
        ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(str(merges), str(vocab))
        return tiktoken.Encoding(name="gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks,
                                 special_tokens={ENDOFTEXT: len(ranks)})
    except (OSError, ValueError, KeyError, AssertionError) as e:
        raise TokenizerError(f"cannot read GPT-2 BPE tables {merges} and {vocab}: {e}") from None


def gpt2_tokenizer(directory: str | Path | None = None) -> tiktoken.Encoding:
    """GPT-2's encoding: from `directory`'s tables if it has them, else `MINIGPT_BPE_DIR`, else tiktoken's."""
    for folder in (directory, os.environ.get("MINIGPT_BPE_DIR")):
        if folder is not None:
            files = find_bpe_files(folder)
            if files:
                return encoding_from_files(*files)
    try:
        return tiktoken.get_encoding("gpt2")
    except Exception as e:  # tiktoken raises whatever its HTTP client raised when offline
        raise TokenizerError(
            "cannot get GPT-2's BPE tables: tiktoken could not download them "
            f"({type(e).__name__}); set MINIGPT_BPE_DIR to a folder holding encoder.json and vocab.bpe"
        ) from None


def encode(tokenizer: tiktoken.Encoding, text: str) -> list[int]:
    """Encode text; a literal "<|endoftext|>" in it is ordinary text, never the special token."""
    return tokenizer.encode(text, disallowed_special=())
