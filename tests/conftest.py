"""Shared test set-up: GPT-2's BPE tables from ../shared, Hypothesis profiles, small models.

Tests never touch the network. The tokenizer tables come from MINIGPT_BPE_DIR; when it is unset
and the repository sits beside the workplace's shared/gpt2-bpe folder, that folder is used. Either
folder may hold either pair of files the library accepts (minigpt.tokenizer.find_bpe_files).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a test that reached for the hub would fail, not hang

from minigpt.tokenizer import BPE_FILE_PAIRS, find_bpe_files  # noqa: E402 (after HF_HUB_OFFLINE)

SHARED_BPE = Path(__file__).resolve().parents[2] / "shared" / "gpt2-bpe"
if "MINIGPT_BPE_DIR" not in os.environ and find_bpe_files(SHARED_BPE):
    os.environ["MINIGPT_BPE_DIR"] = str(SHARED_BPE)

# "dev" for local runs; "ci" bounds the examples and time. Both print the @reproduce_failure blob.
settings.register_profile("dev", max_examples=50, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=30, deadline=None, print_blob=True, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def bpe_dir() -> Path:
    """MINIGPT_BPE_DIR when it holds GPT-2's tables as minigpt.tokenizer looks for them
    (encoder.json + vocab.bpe, or vocab.json + merges.txt), or skip saying how to provide them."""
    folder = os.environ.get("MINIGPT_BPE_DIR")
    if not folder or find_bpe_files(folder) is None:
        pytest.skip("GPT-2 BPE tables not found: set MINIGPT_BPE_DIR to a folder with "
                    + " or ".join(f"{vocab} + {merges}" for merges, vocab in BPE_FILE_PAIRS))
    return Path(folder)


@pytest.fixture(scope="session")
def tokenizer():
    from minigpt.tokenizer import gpt2_tokenizer

    bpe_dir()
    return gpt2_tokenizer()


@pytest.fixture(scope="session")
def tiny_model():
    """The embedded random-tiny model (2 layers, n_embd 64), exact kernels; its tokenizer is built
    only if a test uses it (such a test asks for the `tokenizer` fixture too)."""
    import minigpt

    return minigpt.load("random-tiny")


@pytest.fixture
def loop_feeds(monkeypatch) -> list[int]:
    """The number of ids each forward of minigpt.loops' two loops is given, appended as they run."""
    import minigpt.loops

    fed = []
    for name in ("forward", "forward_cached"):
        def counted(gpt, ids, *args, real=getattr(minigpt.loops, name), **kwargs):
            fed.append(len(ids))
            return real(gpt, ids, *args, **kwargs)
        monkeypatch.setattr(minigpt.loops, name, counted)
    return fed
