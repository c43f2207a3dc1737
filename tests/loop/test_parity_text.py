"""Parity of minigpt's text semantics with Hugging Face's: stop strings, and <|endoftext|> in text.

Live, skipped unless transformers (the `parity` extra) is installed. The checkpoint is the embedded
random-tiny's weights (GPT-2's vocabulary) saved with GPT-2's tables under the hub's names
(vocab.json, merges.txt: the packaged encoder.json and vocab.bpe, the same content), so transformers
builds its GPT2TokenizerFast from the very files minigpt reads. Its greedy continuations repeat
tokens, which is enough to put stop strings inside tokens, across them, on their edges and next to
multi-byte characters.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import minigpt
from minigpt.loading.checkpoint_writer import save_checkpoint
from minigpt.loading.loader import EMBEDDED
from minigpt.loading.weights import random_params
from minigpt.loading.tokenizer import PACKAGED_BPE

REASON = "parity with Hugging Face needs torch and transformers: pip install -e '.[parity]'"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("random-tiny")
    config = EMBEDDED["random-tiny"]
    save_checkpoint(directory, config, random_params(config, 0))
    shutil.copyfile(PACKAGED_BPE / "encoder.json", directory / "vocab.json")
    shutil.copyfile(PACKAGED_BPE / "vocab.bpe", directory / "merges.txt")
    return directory


@pytest.fixture(scope="module")
def hf_tokenizer(checkpoint):
    transformers = pytest.importorskip("transformers", reason=REASON)
    return transformers.GPT2TokenizerFast.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def hf_model(checkpoint):
    pytest.importorskip("torch", reason=REASON)
    transformers = pytest.importorskip("transformers", reason=REASON)
    return transformers.GPT2LMHeadModel.from_pretrained(checkpoint, attn_implementation="eager").eval()


def cut_at_stop(text: str, stops: list[str]) -> str:
    """lm-evaluation-harness's cut of a generation at its `until` strings: before the first of them."""
    for stop in stops:
        text = text.split(stop)[0]
    return text


# (prompt, stop strings): the greedy continuation's tokens are in the comments.
STOP_CASES = {
    "inside-a-token": ("The capital of France is", ["wip"]),  # " is" x5, " wiping", ...
    "across-tokens": ("Über alles", ["ssec"]),  # "es", "secret", ...
    "a-whole-token": ("The capital of France is", [" wiping"]),  # begins and ends on token edges
    "ending-on-a-token-edge": ("The capital of France is", ["ping"]),
    "beginning-on-a-token-edge": ("The capital of France is", [" wip"]),
    "across-two-whole-tokens": ("Once upon a time", [" pretext pretext"]),  # " pretext" x16
    "a-multibyte-token": ("naïve résumé", ["é"]),  # "é" (c3 a9, one token), " tucked", ...
    "after-a-multibyte-token": ("naïve résumé", ["ucked"]),
    "multibyte-across-tokens": ("Paris, été", ["é7"]),  # "é", "782", ...
    "inside-a-token-after-a-multibyte-one": ("Paris, été", ["8"]),
    "the-earliest-of-two": ("naïve résumé", ["ucked", "é t"]),  # both completed by " tucked"
    "none-found": ("The dog", ["never", "é"]),  # " correspondence" x16
}


@pytest.mark.parametrize("case", STOP_CASES)
def test_stop_strings_end_where_hugging_face_stops_and_the_text_where_lm_eval_cuts(checkpoint, hf_model,
                                                                                    hf_tokenizer, case):
    """transformers' greedy generate with stop_strings stops after the token that completes a stop string:
    minigpt returns the same tokens (that one included), and its text is their text cut before the first
    stop string, as lm-eval cuts it. generate, stream and the batch scheduler agree."""
    import torch

    prompt, stops = STOP_CASES[case]
    ids = hf_tokenizer(prompt)["input_ids"]
    with torch.inference_mode():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, stop_strings=stops,
                                tokenizer=hf_tokenizer, attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                pad_token_id=0)
    hf_tokens = out[0, len(ids):].tolist()
    expected_text = cut_at_stop(hf_tokenizer.decode(hf_tokens), stops)
    model = minigpt.load(checkpoint)
    assert minigpt.encode(model.tokenizer, prompt) == ids
    result = minigpt.generate(model, ids, 16, stop=stops)
    print(f"{case}: {hf_tokenizer.convert_ids_to_tokens(hf_tokens)} -> {expected_text!r}")
    assert result.tokens == hf_tokens
    assert result.text == expected_text
    assert result.finish_reason == ("length" if case == "none-found" else "stop")
    streamed = list(minigpt.stream(model, ids, 16, stop=stops))
    assert [t.token for t in streamed] == hf_tokens and "".join(t.text for t in streamed) == expected_text
    batched = minigpt.generate_batch(model, [ids, [464]], 16, stop=stops)[0]
    assert (batched.tokens, batched.text, batched.logprobs, batched.finish_reason) == \
        (result.tokens, result.text, result.logprobs, result.finish_reason)


ENDOFTEXT_TEXTS = ["<|endoftext|>", "a<|endoftext|>b", "Doc one.<|endoftext|>Doc two.", " <|endoftext|> ",
                   "x<|endoftext|><|endoftext|>y", "naïve<|endoftext|>日本語 🙂", "<|endoftext|>\n\nHello",
                   "<|endoftext|", "<|endoftext|>|>", "The dog's 3 toys,\tnaïvely\r\n sorted"]


@pytest.mark.parametrize("text", ENDOFTEXT_TEXTS)
def test_endoftext_in_text_encodes_and_decodes_as_hugging_faces_gpt2_tokenizer_does(hf_tokenizer, tokenizer, text):
    """Hugging Face's GPT2TokenizerFast, built from the same tables: the same ids (50256 for each literal
    <|endoftext|>), and decoding them gives the text back on both sides."""
    ids = minigpt.encode(tokenizer, text)
    assert ids == hf_tokenizer(text)["input_ids"]
    assert ids.count(50256) == text.count("<|endoftext|>")
    assert tokenizer.decode(ids) == hf_tokenizer.decode(ids) == text
