"""Shared test set-up: GPT-2's BPE tables from ../shared, Hypothesis profiles, small models.

Tests never touch the network. The tokenizer tables come from MINIGPT_BPE_DIR; when it is unset
and the repository sits beside the workplace's shared/gpt2-bpe folder, that folder is used.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

SHARED_BPE = Path(__file__).resolve().parents[2] / "shared" / "gpt2-bpe"
if "MINIGPT_BPE_DIR" not in os.environ and (SHARED_BPE / "encoder.json").is_file():
    os.environ["MINIGPT_BPE_DIR"] = str(SHARED_BPE)
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a test that reached for the hub would fail, not hang

# "dev" for local runs; "ci" bounds the examples and time. Both print the @reproduce_failure blob.
settings.register_profile("dev", max_examples=50, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=30, deadline=None, print_blob=True, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def bpe_dir() -> Path:
    """The folder with GPT-2's encoder.json + vocab.bpe, or skip saying how to provide it."""
    folder = os.environ.get("MINIGPT_BPE_DIR")
    if not folder or not (Path(folder) / "encoder.json").is_file():
        pytest.skip("GPT-2 BPE tables not found: set MINIGPT_BPE_DIR to a folder with encoder.json and vocab.bpe")
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
