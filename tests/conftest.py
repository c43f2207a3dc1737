"""Shared test set-up: GPT-2's BPE tables, Hypothesis profiles, small models.

Tests never touch the network. The tokenizer tables are the ones packaged with minigpt
(minigpt/gpt2_bpe/), or MINIGPT_BPE_DIR's when it is set, as the library itself looks for them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a test that reached for the hub would fail, not hang

from minigpt.loading.tokenizer import PACKAGED_BPE, packaged_tables  # noqa: E402 (after HF_HUB_OFFLINE)

# "dev" for local runs; "ci" bounds the examples and time. Both print the @reproduce_failure blob.
settings.register_profile("dev", max_examples=50, deadline=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=30, deadline=None, print_blob=True, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
# scripts/mutants.py: the "ci" examples, no shrinking and no example database (a failure is all it needs)
settings.register_profile("mutants", parent=settings.get_profile("ci"), database=None,
                          phases=[Phase.explicit, Phase.generate])
# HYPOTHESIS_PROFILE=long: the engine's state machine (tests/properties/test_engine_machine.py) for
# 10,000 rules and more, fresh examples every run (docs/testing.md)
settings.register_profile("long", parent=settings.get_profile("dev"), max_examples=500)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


def bpe_dir() -> Path:
    """The folder of GPT-2's tables packaged with minigpt (encoder.json + vocab.bpe), their hashes checked."""
    packaged_tables()
    return PACKAGED_BPE


@pytest.fixture(scope="session")
def tokenizer():
    from minigpt.loading.tokenizer import gpt2_tokenizer

    return gpt2_tokenizer()


@pytest.fixture(scope="session")
def tiny_model():
    """The embedded random-tiny model (2 layers, n_embd 64), exact kernels; its tokenizer is built
    only if a test uses it (such a test asks for the `tokenizer` fixture too)."""
    import minigpt

    return minigpt.load("random-tiny")


@pytest.fixture
def loop_feeds(monkeypatch) -> list[int]:
    """The number of ids each forward of minigpt.loop.loops' two loops is given, appended as they run."""
    import minigpt.loop.loops

    fed = []
    for name in ("forward", "forward_cached"):
        def counted(gpt, ids, *args, real=getattr(minigpt.loop.loops, name), **kwargs):
            fed.append(len(ids))
            return real(gpt, ids, *args, **kwargs)
        monkeypatch.setattr(minigpt.loop.loops, name, counted)
    return fed
