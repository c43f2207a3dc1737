"""minigpt.cost: lesson 03-01's figures come out of the arithmetic exactly, and the arithmetic matches the code."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from minigpt.cli import main
from minigpt.cli.cost import times
from minigpt.config import GPT2_SIZES
from minigpt.cost import ARCHITECTURES, _flops, _triangular, estimate, gpt2_architecture
from minigpt.errors import InputError
from minigpt.kv_cache import new_cache
from minigpt.params import random_params

GPT2 = ARCHITECTURES["gpt2"]
LLAMA = ARCHITECTURES["llama-3-8b"]
STAIRCASE_MD = Path(__file__).resolve().parents[1] / "docs" / "staircase.md"


def test_lesson_512_plus_256_is_163712_tokens_against_768():
    c = estimate(GPT2, 512, 256)
    assert (c.naive_tokens, c.cached_tokens) == (163_712, 768)
    assert round(c.ratio) == 213


@pytest.mark.parametrize("prompt, reply, naive, cached, ratio", [(2048, 512, 1_179_392, 2_560, 461),
                                                                  (8192, 1024, 8_912_384, 9_216, 967)])
def test_lesson_longer_requests_ratios(prompt, reply, naive, cached, ratio):
    """2,048 + 512 gives 461x; 8,192 + 1,024 gives 967x, the lesson's "almost 1,000x"."""
    c = estimate(GPT2, prompt, reply)
    assert (c.naive_tokens, c.cached_tokens, round(c.ratio)) == (naive, cached, ratio)


def test_gpt2_small_512_plus_256_in_float16_caches_27_mib():
    assert estimate(GPT2, 512, 256, "float16").kv_bytes_total == 27 * 2**20


def test_gpt2_small_lm_head_is_38_6m_parameters():
    assert GPT2.vocab_size * GPT2.n_embd == 38_597_376


def test_llama_3_8b_kv_cache_is_128_kib_per_token_and_96_mib_for_768():
    c = estimate(LLAMA, 512, 256)
    assert c.dtype == "bfloat16"
    assert c.kv_bytes_per_token == 131_072 == 128 * 2**10
    assert c.kv_bytes_total == 96 * 2**20


def test_llama_3_8b_has_8_billion_parameters_with_its_embedding():
    assert LLAMA.matrix_params + LLAMA.vocab_size * LLAMA.n_embd == pytest.approx(8.03e9, rel=1e-3)


def test_gpt2_small_kv_bytes_per_token_float32_and_float16():
    """2 (K and V) x 12 layers x 768 x 4 bytes = 73,728 in float32; half that, 36,864, in float16."""
    assert estimate(GPT2, 1, 1).kv_bytes_per_token == 2 * 12 * 768 * 4 == 73_728
    assert estimate(GPT2, 1, 1, "float16").kv_bytes_per_token == 36_864


@pytest.mark.parametrize("name", list(GPT2_SIZES))
def test_kv_bytes_per_token_match_minigpts_own_cache(name):
    config = GPT2_SIZES[name]
    capacity = 32
    cache = new_cache(config, capacity)
    assert estimate(gpt2_architecture(name, config), 1, 1).kv_bytes_per_token == cache.nbytes // capacity


def test_weight_bytes_per_token_are_the_models_weight_matrices():
    """Every 2-D weight except the position table (one row read per token), counted from real params."""
    config = ARCHITECTURES["distilgpt2"]
    params = random_params(GPT2_SIZES["distilgpt2"], seed=0)
    matrices = [params.wte] + [lin.weight for b in params.h
                               for lin in (b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj)]
    assert estimate(config, 1, 1).weight_bytes_per_token == sum(m.nbytes for m in matrices)


@pytest.mark.parametrize("prompt, reply", [(1, 1), (1, 40), (7, 13), (512, 256)])
def test_naive_flops_closed_form_equals_summing_every_step(prompt, reply):
    """The closed form equals the per-step sum: step n is a forward over P + n positions."""
    steps = sum(_flops(GPT2, prompt + n, _triangular(prompt + n), 1) for n in range(reply))
    assert estimate(GPT2, prompt, reply).naive_flops == steps


def test_gpt2_small_decode_step_is_about_twice_its_124m_parameters():
    """One more cached token at short context: 2 FLOPs per weight (85M in blocks + 38.6M LM head)."""
    one_more = estimate(GPT2, 1, 2).cached_flops - estimate(GPT2, 1, 1).cached_flops
    assert one_more == pytest.approx(2 * 124e6, rel=0.01)


def test_numpy_integers_are_counts_too():
    assert estimate(GPT2, np.int64(512), np.int32(256)) == estimate(GPT2, 512, 256)


@pytest.mark.parametrize("prompt, reply, dtype", [(0, 5, None), (5, 0, None), (True, 5, None), (5.0, 5, None),
                                                  (5, 5, "int8")])
def test_invalid_requests_raise_input_error(prompt, reply, dtype):
    with pytest.raises(InputError):
        estimate(GPT2, prompt, reply, dtype)


def test_cli_json_has_the_issue_keys_and_figures(capsys):
    assert main(["cost", "--prompt", "512", "--reply", "256", "--model", "llama-3-8b", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {k: doc[k] for k in ("naive_tokens", "cached_tokens", "kv_bytes_per_token", "kv_bytes_total")} == {
        "naive_tokens": 163_712, "cached_tokens": 768, "kv_bytes_per_token": 131_072, "kv_bytes_total": 96 * 2**20}
    assert np.isclose(doc["ratio"], 163_712 / 768)


def test_cli_text_for_512_plus_256_is_what_docs_staircase_md_quotes(capsys):
    """The page's cost block, verbatim: FLOPs 29.8 T vs 161 G (185x), 494,128,128 bytes of weights,
    56,623,104 bytes (54 MiB) of cache; a change to the output or the arithmetic must update the page."""
    assert main(["cost", "--prompt", "512", "--reply", "256"]) == 0
    out = capsys.readouterr().out
    assert "29.8 T" in out and "161 G" in out and "185x" in out
    assert "494,128,128 bytes" in out and "56,623,104 bytes (54 MiB)" in out
    assert out in STAIRCASE_MD.read_text()


def test_cli_text_for_a_tiny_request_shows_ratios_below_one_and_the_counting_rule(capsys):
    """1 + 1: the lesson's count gives 1 naive token against 2 cached; the output says why."""
    assert main(["cost", "--prompt", "1", "--reply", "1"]) == 0
    out = capsys.readouterr().out
    assert "0.5x" in out and "0.593x" in out and "never fed back" in out


@pytest.mark.parametrize("ratio, text", [(0.5, "0.5x"), (0.5931, "0.593x"), (1.7142, "1.71x"), (30.24, "30.2x"),
                                         (213.17, "213x"), (1179.2, "1,179x")])
def test_ratios_print_with_about_three_significant_figures(ratio, text):
    assert times(ratio) == text


def test_cli_text_shows_ratio_and_warns_beyond_the_context(capsys):
    assert main(["cost", "--prompt", "8192", "--reply", "1024"]) == 0
    out = capsys.readouterr().out
    assert "8,912,384" in out and "967x" in out and "exceed gpt2's context of 1,024" in out


@pytest.mark.parametrize("argv", [["cost", "--prompt", "0", "--reply", "4"], ["cost", "--reply", "4"],
                                  ["cost", "--prompt", "4", "--reply", "4", "--model", "llama"],
                                  ["cost", "--prompt", "4", "--reply", "4", "--dtype", "int8"]])
def test_cli_usage_errors_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
