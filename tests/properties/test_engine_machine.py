"""The engine as a state machine (minigpt.testing.EngineMachine): submits, cancels, steps and runs to
the end interleaved on pools from the tightest that fits up, the pages and jobs checked after every
rule and every result bitwise its run alone. HYPOTHESIS_PROFILE=long runs it for 10,000 rules and
more (docs/testing.md)."""

from __future__ import annotations

import pytest
from hypothesis import settings

from minigpt.testing import EngineMachine
from minigpt.testing.strategies import gpt2_vocab_models, models


class SmallModels(EngineMachine):
    """Random small GPT-2s (vocabularies of 2-64 tokens), every option but text ones."""

    model = models(min_positions=33)  # three pages at least


class TextModels(EngineMachine):
    """GPT-2's vocabulary and tokenizer: stop strings and constraints too."""

    model = gpt2_vocab_models(min_positions=33)
    max_jobs = 5
    constrained = pytest.importorskip("llguidance", reason="constraints need the structured extra") is not None


TestTheEngineKeepsItsPagesAndJobsConsistentAndEveryResultBitwiseAlone = SmallModels.TestCase
# the runs are cheap, and the rarer interleavings (a scored prefill replacing a held page) need many
TestTheEngineKeepsItsPagesAndJobsConsistentAndEveryResultBitwiseAlone.settings = settings(
    max_examples=3 * settings.default.max_examples)
TestTheEngineWithStopStringsAndConstraintsKeepsEveryResultBitwiseAlone = TextModels.TestCase
# GPT-2's vocabulary makes every step and every run alone some 10x dearer: a fifth of the examples
TestTheEngineWithStopStringsAndConstraintsKeepsEveryResultBitwiseAlone.settings = settings(
    max_examples=max(settings.default.max_examples // 5, 1))


def teardown_module():
    print(f"\nEngineMachine: {EngineMachine.rules_run} rules run")
