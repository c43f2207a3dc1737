"""minigpt.loop.cost: lesson 03-01's figures come out of the arithmetic exactly, and the arithmetic matches the code."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest

from minigpt.cli import main
from minigpt.cli.cost import times
from minigpt.gpt2.config import GPT2_SIZES
from minigpt.loop.cost import ARCHITECTURES, MAX_TOKENS, estimate, gpt2_architecture
from minigpt.loop.loops import cached_steps, naive_steps
from minigpt.cache.kv_cache import new_cache
from minigpt.engine.paging import PagePool
from minigpt.loading.weights import random_params
from requesting import new_request
from minigpt.loop.sequence import Sequence

GPT2 = ARCHITECTURES["gpt2"]
LLAMA = ARCHITECTURES["llama-3-8b"]
STAIRCASE_MD = Path(__file__).resolve().parents[2] / "docs" / "staircase.md"


def test_lesson_512_plus_256_is_163712_naive_tokens_against_our_767_and_the_lessons_768():
    """Lesson 03-01's 768 = P + N counts a loop that also feeds its last token; minigpt's feeds P + N - 1."""
    c = estimate(GPT2, 512, 256)
    assert (c.naive_tokens, c.cached_tokens, c.prompt + c.reply) == (163_712, 767, 768)
    assert round(c.ratio) == 213 == round(163_712 / 768)


@pytest.mark.parametrize("prompt, reply, naive, cached, ratio", [(2048, 512, 1_179_392, 2_559, 461),
                                                                  (8192, 1024, 8_912_384, 9_215, 967)])
def test_lesson_longer_requests_ratios(prompt, reply, naive, cached, ratio):
    """2,048 + 512 gives 461x; 8,192 + 1,024 gives 967x, lesson 03-01's "almost 1,000x" (P + N: the same)."""
    c = estimate(GPT2, prompt, reply)
    assert (c.naive_tokens, c.cached_tokens, round(c.ratio)) == (naive, cached, ratio)
    assert round(naive / (prompt + reply)) == ratio


@pytest.mark.parametrize("prompt, reply", [(1, 1), (1, 5), (4, 1), (3, 7), (17, 4)])
def test_token_counts_are_the_positions_the_loops_feed(tiny_model, prompt, reply, loop_feeds):
    """Summed over the forwards of minigpt's own loops; and the cached count is the capacity a
    request's cache is made for."""
    fed = loop_feeds
    request = new_request(tiny_model, list(range(1, prompt + 1)), reply, stop_at_eos=False)
    c = estimate(gpt2_architecture("tiny", tiny_model.config), prompt, reply)
    list(naive_steps(tiny_model, Sequence(request)))
    assert sum(fed) == c.naive_tokens
    fed.clear()
    list(cached_steps(tiny_model, Sequence(request)))
    assert sum(fed) == c.cached_tokens == request.max_positions


def test_a_one_token_reply_costs_the_same_in_both_loops():
    """One step is one forward over the prompt in both loops: ratios 1, not the 0.5 of P + N."""
    c = estimate(GPT2, 1, 1)
    assert (c.naive_tokens, c.cached_tokens, c.naive_flops) == (1, 1, c.cached_flops)


def test_the_kv_cache_holds_every_position_fed():
    c = estimate(GPT2, 512, 256)
    assert c.kv_bytes_total == c.kv_bytes_per_token * 767 == 56_549_376


@pytest.mark.parametrize("arch, dtype, mib", [(GPT2, "float32", 54), (GPT2, "float16", 27), (LLAMA, None, 96)])
def test_a_768_token_sequence_caches_what_docs_staircase_md_says(arch, dtype, mib):
    assert estimate(arch, 1, 1, dtype).kv_bytes_per_token * 768 == mib * 2**20


def test_gpt2_small_lm_head_is_38_6m_parameters():
    assert GPT2.vocab_size * GPT2.n_embd == 38_597_376


def test_llama_3_8b_kv_cache_is_128_kib_per_token_in_bfloat16():
    c = estimate(LLAMA, 512, 256)
    assert c.dtype == "bfloat16"
    assert c.kv_bytes_per_token == 131_072 == 128 * 2**10


def test_llama_3_8b_has_8_billion_parameters_with_its_embedding():
    assert LLAMA.matrix_params + LLAMA.vocab_size * LLAMA.n_embd == pytest.approx(8.03e9, rel=1e-3)


def test_gpt2_small_kv_bytes_per_token_float32_and_float16():
    """2 (K and V) x 12 layers x 768 x 4 bytes = 73,728 in float32; half that, 36,864, in float16."""
    assert estimate(GPT2, 1, 1).kv_bytes_per_token == 2 * 12 * 768 * 4 == 73_728
    assert estimate(GPT2, 1, 1, "float16").kv_bytes_per_token == 36_864


@pytest.mark.parametrize("name", list(GPT2_SIZES))
def test_kv_bytes_per_token_match_minigpts_own_cache_and_page_pool(name):
    config = GPT2_SIZES[name]
    capacity = 32
    cache = new_cache(config, capacity)
    assert estimate(gpt2_architecture(name, config), 1, 1).kv_bytes_per_token == cache.nbytes // capacity
    pool = PagePool(config, 2)  # its pages are reserved, not written: no memory committed
    assert pool.page_bytes == (pool.k.nbytes + pool.v.nbytes) // 2


def test_weight_bytes_per_token_are_the_models_weight_matrices():
    """Every 2-D weight except the position table (one row read per token), counted from real params."""
    config = ARCHITECTURES["distilgpt2"]
    params = random_params(GPT2_SIZES["distilgpt2"], seed=0)
    matrices = [params.wte] + [lin.weight for b in params.h
                               for lin in (b.attn.c_attn, b.attn.c_proj, b.mlp.c_fc, b.mlp.c_proj)]
    assert estimate(config, 1, 1).weight_bytes_per_token == sum(m.nbytes for m in matrices)


def forward_flops(arch, start: int, end: int) -> int:
    """docs/staircase.md's estimate for one forward over positions start .. end-1, written out here
    as the test's own oracle: weights per position, q.k and v per key seen, one LM head."""
    keys_seen = sum(t + 1 for t in range(start, end))
    return (2 * arch.n_layer * arch.block_params * (end - start) + 4 * arch.n_layer * arch.attn_width * keys_seen
            + 2 * arch.n_embd * arch.vocab_size)


@pytest.mark.parametrize("prompt, reply", [(1, 1), (1, 40), (7, 13), (512, 256)])
def test_flops_closed_forms_equal_summing_every_forward_of_the_loops(prompt, reply):
    """Naive: step n is a forward over positions 0 .. P+n-1. Cached: the prefill over 0 .. P-1,
    then one forward per position P .. P+N-2."""
    c = estimate(GPT2, prompt, reply)
    assert c.naive_flops == sum(forward_flops(GPT2, 0, prompt + n) for n in range(reply))
    assert c.cached_flops == forward_flops(GPT2, 0, prompt) + sum(forward_flops(GPT2, t, t + 1)
                                                                  for t in range(prompt, prompt + reply - 1))


def test_gpt2_small_decode_step_is_about_twice_its_124m_parameters():
    """One more cached token at short context: 2 FLOPs per weight (85M in blocks + 38.6M LM head)."""
    one_more = estimate(GPT2, 1, 2).cached_flops - estimate(GPT2, 1, 1).cached_flops
    assert one_more == pytest.approx(2 * 124e6, rel=0.01)


def test_the_command_line_s_bound_on_tokens_keeps_every_ratio_finite():
    """10**400 overflows float64 in the ratios: the command line takes at most MAX_TOKENS."""
    assert math.isfinite(estimate(GPT2, MAX_TOKENS, MAX_TOKENS).ratio) and estimate(GPT2, MAX_TOKENS, MAX_TOKENS).ratio > 1


def test_cli_json_has_the_counts_and_kv_figures(capsys):
    assert main(["cost", "--prompt", "512", "--reply", "256", "--model", "llama-3-8b", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {k: doc[k] for k in ("naive_tokens", "cached_tokens", "kv_bytes_per_token", "kv_bytes_total")} == {
        "naive_tokens": 163_712, "cached_tokens": 767, "kv_bytes_per_token": 131_072, "kv_bytes_total": 131_072 * 767}
    assert np.isclose(doc["ratio"], 163_712 / 767)


def test_cli_text_for_512_plus_256_is_what_docs_staircase_md_quotes(capsys):
    """The page's cost block, verbatim: FLOPs 29.8 T vs 161 G (185x), 494,128,128 bytes of weights,
    56,549,376 bytes (53.93 MiB) of cache, lesson 03-01's 768 beside our 767; a change to the output or
    the arithmetic must update the page."""
    assert main(["cost", "--prompt", "512", "--reply", "256"]) == 0
    out = capsys.readouterr().out
    assert "29.8 T" in out and "161 G" in out and "185x" in out
    assert "494,128,128 bytes" in out and "56,549,376 bytes (53.93 MiB)" in out
    assert "767" in out and "P + N = 768" in out
    assert out in STAIRCASE_MD.read_text()


def test_cli_text_for_a_tiny_request_shows_equal_work_and_the_counting_rule(capsys):
    """1 + 1: one forward over the prompt in either loop; the output says how each loop counts."""
    assert main(["cost", "--prompt", "1", "--reply", "1"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"tokens through model +1 +1 +1x\n", out) and re.search(r"FLOPs \(approx.\) .* 1x\n", out)
    assert "never fed back: P + N - 1" in out and "Lesson 03-01 counts\n P + N = 2" in out


def test_cli_table_columns_are_as_wide_as_their_widest_cell(capsys):
    """20-digit counts do not run the columns together: every cell is two spaces or more from the next."""
    assert main(["cost", "--prompt", "10000000000", "--reply", "10000000000"]) == 0
    lines = capsys.readouterr().out.splitlines()[2:5]
    assert [re.split(r" {2,}", line.strip()) for line in lines] == [
        ["naive loop", "KV cache", "ratio"],
        ["tokens through model", "149,999,999,995,000,000,000", "19,999,999,999", "7,500,000,000x"],
        ["FLOPs (approx.)", "4.3e+19 P", "7.37e+09 P", "5,833,333,491x"]]
    assert len({len(line) for line in lines}) == 1  # right-aligned numbers end in one column


@pytest.mark.parametrize("ratio, text", [(0.5, "0.5x"), (0.5931, "0.593x"), (1.7142, "1.71x"), (30.24, "30.2x"),
                                         (213.17, "213x"), (1179.2, "1,179x")])
def test_ratios_print_with_about_three_significant_figures(ratio, text):
    assert times(ratio) == text


def test_cli_text_shows_ratio_and_warns_beyond_the_context(capsys):
    assert main(["cost", "--prompt", "8192", "--reply", "1024"]) == 0
    out = capsys.readouterr().out
    assert "8,912,384" in out and "967x" in out and "9,215 positions exceed gpt2's context of 1,024" in out


@pytest.mark.parametrize("reply, fits", [(513, True), (514, False)])
def test_the_context_holds_every_fed_position_and_the_last_token_is_never_fed(reply, fits):
    """512 + 513 tokens feed 1,024 positions: they fit GPT-2's context, one more does not."""
    assert estimate(gpt2_architecture("gpt2", GPT2_SIZES["gpt2"]), 512, reply).fits_context is fits


@pytest.mark.parametrize("argv", [["cost", "--prompt", "0", "--reply", "4"], ["cost", "--reply", "4"],
                                  ["cost", "--prompt", "4", "--reply", "4", "--model", "llama"],
                                  ["cost", "--prompt", "4", "--reply", "4", "--dtype", "int8"],
                                  ["cost", "--prompt", "4", "--reply", str(10 ** 15 + 1)],
                                  ["cost", "--prompt", "4.0", "--reply", "4"]])
def test_cli_usage_errors_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
