"""The real pretrained GPT-2 (124M) continues "The dog" exactly as transformers' own test suite expects.

transformers' tests/models/gpt2/test_modeling_gpt2.py (`test_lm_generate_gpt2`) decodes [464, 3290]
greedily to 20 ids. The tests never download: the weights come from weights/gpt2 in this repository
if it exists, else from huggingface_hub's cache with the hub offline; otherwise the test skips and
says how to provide them (weights/README.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import minigpt
from minigpt.errors import OfflineError

WEIGHTS = Path(__file__).resolve().parents[2] / "weights" / "gpt2"
PROMPT = "The dog"
PROMPT_IDS = [464, 3290]
# The prompt and 18 greedy tokens:
# "The dog was found in a field near the intersection of West and West Streets.\n\nThe dog"
EXPECTED_IDS = [464, 3290, 373, 1043, 287, 257, 2214, 1474, 262, 16246, 286, 2688, 290, 2688, 27262, 13, 198, 198,
                464, 3290]
HOW_TO_PROVIDE = (
    "hf download openai-community/gpt2 config.json model.safetensors vocab.json merges.txt --local-dir weights/gpt2 "
    "(see weights/README.md), or run minigpt.load('gpt2') once online to fill the huggingface_hub cache"
)


@pytest.fixture(scope="module")
def gpt2():
    """The pretrained gpt2 from weights/gpt2 or the hub cache, never from the network; else skip."""
    if WEIGHTS.is_dir():
        return minigpt.load(WEIGHTS)
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # whatever the environment says
        try:
            return minigpt.load("gpt2")
        except OfflineError:
            pytest.skip(f"the pretrained gpt2 weights are neither in {WEIGHTS} nor in the huggingface_hub "
                        f"cache; to run this test: {HOW_TO_PROVIDE}")


@pytest.mark.parametrize("use_cache", [True, False], ids=["cache", "no-cache"])
def test_the_dog_greedy_matches_transformers_suite(gpt2, use_cache):
    """Greedy "The dog" to 20 ids gives transformers' expected ids, with and without the KV cache."""
    prompt = minigpt.encode(gpt2.tokenizer, PROMPT)
    assert prompt == PROMPT_IDS
    result = minigpt.generate(gpt2, prompt, len(EXPECTED_IDS) - len(prompt), use_cache=use_cache)
    assert result.prompt_ids + result.tokens == EXPECTED_IDS
