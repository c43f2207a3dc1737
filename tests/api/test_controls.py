"""The sampling controls through the API, the command line and `batch`: logit_bias forces and bans
as OpenAI's does, min_tokens holds off <|endoftext|> and the stop strings as vLLM's does, the
controls reach the speculative loop's sampled rows, and the command line and a batch line give
the API's tokens. The formulas themselves are checked against a reference loop in
tests/properties/test_logits_processing.py; the server in tests/server/test_serve_controls.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from checkpoints import tiny
from chi_square import chi_square_rejects
from commands import batch, cli

import minigpt
from minigpt.loop.processing import Penalties
from minigpt.loop.sampling import SamplingOptions, probabilities

EOS = 50256
CONTROLS = dict(logit_bias={11: 5.0, EOS: -100.0}, presence_penalty=0.5, frequency_penalty=1.5,
                repetition_penalty=1.3, min_tokens=3)


@pytest.fixture(scope="module")
def ids(tokenizer):
    return minigpt.encode(tokenizer, "The dog ran to the park")


def test_a_bias_of_100_all_but_forces_a_token_and_of_minus_100_all_but_bans_it(tiny_model, ids):
    assert minigpt.generate(tiny_model, ids, 5, logit_bias={11: 100}).tokens == [11] * 5
    greedy = minigpt.generate(tiny_model, ids, 1).tokens[0]
    assert greedy not in minigpt.generate(tiny_model, ids, 5, logit_bias={greedy: -100}).tokens


def test_min_tokens_holds_off_the_end_of_text_token_that_would_end_the_text_at_once(tiny_model, ids):
    forced = minigpt.generate(tiny_model, ids, 8, logit_bias={EOS: 100})
    assert forced.tokens == [EOS] and forced.finish_reason == "eos"
    held = minigpt.generate(tiny_model, ids, 8, logit_bias={EOS: 100}, min_tokens=3)
    assert len(held.tokens) == 4 and EOS not in held.tokens[:3] and held.tokens[3] == EOS
    assert held.finish_reason == "eos"
    assert minigpt.generate(tiny_model, ids, 8, logit_bias={EOS: 100}, min_tokens=3, stop_at_eos=False).tokens \
        == [EOS] * 8  # not the end of the text: nothing to hold off


def test_min_tokens_passes_over_a_stop_string_completed_within_them_as_vllm_does(tiny_model, tokenizer, ids):
    comma = minigpt.encode(tokenizer, ",")[0]
    result = minigpt.generate(tiny_model, ids, 8, logit_bias={comma: 100}, stop=[","], min_tokens=2)
    assert result.tokens == [comma] * 3 and result.text == ",," and result.finish_reason == "stop"
    streamed = list(minigpt.stream(tiny_model, ids, 8, logit_bias={comma: 100}, stop=[","], min_tokens=2))
    assert "".join(t.text for t in streamed) == ",,"


def test_the_logit_processing_the_controls_ask_for_is_none_when_they_change_nothing(tiny_model, ids):
    from requesting import new_request
    assert new_request(tiny_model, ids, 4).processing == ()
    assert new_request(tiny_model, ids, 4, **CONTROLS).processing == (
        Penalties((11, EOS), (5.0, -100.0), 0.5, 1.5, 1.3),)


def test_controls_are_per_prompt_in_generate_batch_each_result_generate_s_alone(tiny_model, ids):
    results = minigpt.generate_batch(tiny_model, [ids, ids[:3]], 6, frequency_penalty=[2.0, 0.0],
                                     logit_bias=[{11: 3.0}, None], min_tokens=2)
    assert results[0].tokens == minigpt.generate(tiny_model, ids, 6, frequency_penalty=2.0, logit_bias={11: 3.0},
                                                 min_tokens=2).tokens
    assert results[1].tokens == minigpt.generate(tiny_model, ids[:3], 6, min_tokens=2).tokens


def test_sampled_speculative_decoding_draws_from_the_processed_distribution():
    """End to end, 1,500 seeded runs: the first token of sampled speculation with a bias and a
    repetition penalty follows p of the processed row, as plain sampling's does."""
    model, prompt = tiny(6, 0), [1, 2, 3, 1, 2]
    options = dict(temperature=1.5, logit_bias={4: 2.0, 0: -1.0}, repetition_penalty=2.0)
    z = model.forward(prompt)[-1].astype(np.float64) + [-1.0, 0, 0, 0, 2.0, 0]
    seen = np.isin(np.arange(6), prompt)
    z = np.where(seen, np.where(z > 0, z / 2.0, z * 2.0), z)
    p = probabilities(z, SamplingOptions(temperature=1.5))
    counts, drafted = np.zeros(6, int), 0
    for seed in range(1500):
        result = minigpt.generate(model, prompt, 2, speculate="ngram", draft_tokens=1, seed=seed, **options)
        counts[result.tokens[0]] += 1
        drafted += result.drafted
    assert drafted > 0
    assert not chi_square_rejects(counts, p)


# ------------------------------------------------------------------- the command line and batch


def test_the_command_line_s_flags_give_the_api_s_tokens(capsys, tiny_model, tokenizer):
    code, out, err = cli(capsys, "The dog ran", "--model", "random-tiny", "--max-new-tokens", "6", "--json",
                         "--logit-bias", "11=5", "--logit-bias", f"{EOS}=-100", "--presence-penalty", "0.5",
                         "--frequency-penalty", "1.5", "--repetition-penalty", "1.3", "--min-tokens", "3")
    assert code == 0, err
    document = json.loads(out)
    alone = minigpt.generate(tiny_model, minigpt.encode(tokenizer, "The dog ran"), 6, **CONTROLS)
    assert (document["tokens"], document["logprobs"]) == (alone.tokens, alone.logprobs)
    assert document["logit_bias"] == {"11": 5.0, str(EOS): -100.0} and document["min_tokens"] == 3


def test_a_batch_line_s_controls_give_the_api_s_tokens(capsys, tmp_path, tiny_model, tokenizer):
    lines = [{"prompt": "The dog ran", "logit_bias": {"11": 5, str(EOS): -100}, "presence_penalty": 0.5,
              "frequency_penalty": 1.5, "repetition_penalty": 1.3, "min_tokens": 3},
             {"prompt": "The dog ran"}]
    code, outputs, err = batch(capsys, tmp_path, lines, "random-tiny", "--max-new-tokens", "6")
    assert code == 0, err
    ids = minigpt.encode(tokenizer, "The dog ran")
    assert outputs[0]["tokens"] == minigpt.generate(tiny_model, ids, 6, **CONTROLS).tokens
    assert outputs[1]["tokens"] == minigpt.generate(tiny_model, ids, 6).tokens


def test_a_command_line_control_is_a_line_s_default(capsys, tmp_path, tiny_model, tokenizer):
    lines = [{"prompt": "The dog ran"}, {"prompt": "The dog ran", "frequency_penalty": 0}]
    code, outputs, err = batch(capsys, tmp_path, lines, "random-tiny", "--max-new-tokens", "6",
                               "--frequency-penalty", "2")
    assert code == 0, err
    ids = minigpt.encode(tokenizer, "The dog ran")
    assert outputs[0]["tokens"] == minigpt.generate(tiny_model, ids, 6, frequency_penalty=2).tokens
    assert outputs[1]["tokens"] == minigpt.generate(tiny_model, ids, 6).tokens
