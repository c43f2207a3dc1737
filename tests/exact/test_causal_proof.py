"""The causal-mask proof (minigpt.exact.causal_proof) and `python -m minigpt prove`.

The proof must pass on a correct model and must fail, at the right cells, on kernels that break
batch invariance or the mask; its bit comparisons must see a single flipped bit.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from minigpt.api.api import prove
from minigpt.exact.causal_proof import COLUMNS, compare
from minigpt.loading.checkpoint_writer import save_checkpoint
from minigpt.cli import main
from minigpt.cli.prove import render
from minigpt.gpt2.config import GPT2Config
from minigpt.errors import InputError
from minigpt.exact.kernels import EXACT
from minigpt import load
from minigpt.loading.weights import random_params

PROMPT = [464, 1332, 9335, 318]  # "The causal mask is"
FIXTURES = Path(__file__).parents[1] / "fixtures"


def f32(*values) -> np.ndarray:
    return np.array([values], np.float32)  # one position, len(values) wide


def test_compare_counts_ulps_between_neighbouring_floats_and_across_zero():
    one = np.float32(1.0)
    assert compare("c", 0, "l", "q", f32(one), f32(np.nextafter(one, np.float32(2)))).max_ulp == 1
    tiny = np.nextafter(np.float32(0), np.float32(1))  # the smallest subnormal
    assert compare("c", 0, "l", "q", f32(-tiny), f32(tiny)).max_ulp == 2
    assert compare("c", 0, "l", "q", f32(1.0, -3.5), f32(1.0, -3.5)).position is None


def test_compare_sees_the_sign_of_zero_and_names_the_first_differing_position():
    c = compare("c", 0, "l", "q", f32(0.0), f32(-0.0))
    assert (c.position, c.max_ulp) == (0, 0)  # equal under ==, different bits
    a = np.zeros((3, 2), np.float32)
    b = a.copy()
    b[2, 1] = 1e-30
    assert compare("c", 0, "l", "q", a, b, first_position=5).position == 7


def test_compare_refuses_arrays_that_are_not_float32():
    with pytest.raises(TypeError, match="float32"):
        compare("c", 0, "l", "q", f32(1.0).astype(np.float64), f32(1.0))


@pytest.fixture(scope="module")
def proof(tiny_model):
    return prove(tiny_model, PROMPT, np.int64(5))  # any integer type will do


def rendered(proof) -> str:
    """The proof's table, as `python -m minigpt prove` prints it after the model line."""
    return render(proof)


def test_proof_holds_on_the_exact_kernels_in_every_cell_that_applies(proof, tiny_model):
    assert proof.holds
    assert [row.layer for row in proof.rows] == ["embeddings", "block 0", "block 1", "ln_f", "logits"]
    applicable = {"embeddings": {"hidden", "causal", "cached"}, "block 0": set(COLUMNS), "block 1": set(COLUMNS),
                  "ln_f": {"hidden", "causal", "cached"}, "logits": {"causal", "cached"}}
    for row in proof.rows:
        assert {c for c, v in row.verdicts.items() if v is not None} == applicable[row.layer]
        assert all(v is not False for v in row.verdicts.values()) and row.scale_ulp == 0
    exact, fast = proof.drifts
    assert (exact.kernels, exact.max_ulp, exact.tokens_equal) == ("exact", 0, True)
    assert not any(exact.first.values())
    assert fast.kernels == "fast" and fast.first["masked"] is None  # the mask itself is exact in both
    assert proof.steps == 5 and type(proof.steps) is int
    assert "result: HOLDS" in rendered(proof) and "drift, fast kernels" in rendered(proof)


def test_proof_counts_the_work_of_both_loops(proof):
    P, N = len(PROMPT), 5
    assert proof.work.naive == P * N + N * (N - 1) // 2
    assert proof.work.cached == P + N - 1
    assert proof.work.repeated_share == pytest.approx(1 - (P + N - 1) / (P * N + N * (N - 1) // 2))


def test_proof_fails_where_a_kernel_depends_on_how_many_rows_it_is_given(tiny_model):
    """A linear layer whose rows shift with the batch size breaks "unchanged" and "cached", not causality."""
    def batch_dependent(x, weight, bias):
        return EXACT.linear(x, weight, bias) + np.float32(1e-6) * np.float32(len(x))

    model = dataclasses.replace(tiny_model, kernels=dataclasses.replace(EXACT, name="batch-dependent", linear=batch_dependent))
    proof = prove(model, PROMPT, 3)
    assert not proof.holds
    block = proof.rows[1].verdicts
    assert (block["hidden"], block["K"], block["cached"]) == (False, False, False)
    assert (block["masked"], block["causal"]) == (True, True)
    first = proof.drifts[0].first["cached"]
    assert (first.step, first.layer, first.quantity, first.position) == (1, "block 0", "K", len(PROMPT))
    assert "result: FAILS with the batch-dependent kernels" in rendered(proof)


def unmasked_weights(q, k):
    """Attention weights without the causal mask (the contract of layers.Kernels' attention_weights): every
    query row sees all the keys of its forward, the later ones included."""
    scores = q @ k.transpose(0, 2, 1) / np.float32(np.sqrt(q.shape[2]))  # [H, T, S]
    w = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return w / w.sum(axis=-1, keepdims=True)


def test_proof_fails_where_the_mask_leaks(tiny_model):
    def attend(q, k, v):
        return unmasked_weights(q, k) @ v

    unmasked = dataclasses.replace(EXACT, name="unmasked", attend=attend, attention_weights=unmasked_weights)
    model = dataclasses.replace(tiny_model, kernels=unmasked)
    proof = prove(model, PROMPT, 3)
    assert not proof.holds
    assert proof.rows[1].verdicts["masked"] is False and proof.rows[2].verdicts["causal"] is False


@pytest.mark.parametrize("directory", sorted(p.parent for p in FIXTURES.glob("*/config.json")), ids=lambda p: p.name)
def test_proof_holds_on_every_checkpoint_layout_and_dtype_in_the_fixtures(directory):
    """float32, float16 and bfloat16 files, hub and sharded layouts; 12 + 8 positions cross a TILE."""
    assert prove(load(directory), list(range(1, 13)), 8).holds


def test_proof_needs_two_steps_and_a_prompt_that_fits(tiny_model):
    for n_steps in (1, 2.0, True):
        with pytest.raises(InputError, match="n_steps must be an integer >= 2"):
            prove(tiny_model, PROMPT, n_steps)
    with pytest.raises(InputError, match="n_positions"):
        prove(tiny_model, PROMPT, tiny_model.config.n_positions)


# ------------------------------------------------------------------------------------------- CLI


def test_cli_prove_exits_0_and_prints_the_table(tokenizer, capsys):
    assert main(["prove", "--model", "random-tiny", "--steps", "3", "--prompt", "Hello there"]) == 0
    out = capsys.readouterr().out
    assert "block 1" in out and "result: HOLDS" in out and "drift, fast kernels" in out


def test_cli_prove_json_keys_and_exit_code_match_holds(tokenizer, capsys):
    for kernels in ("exact", "fast"):
        code = main(["prove", "--model", "random-tiny", "--steps", "3", "--kernels", kernels, "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert set(doc) == {"model", "prompt", "kernels", "prompt_len", "steps", "tokens", "rows", "work",
                            "drifts", "holds"}
        assert doc["kernels"] == kernels and code == (0 if doc["holds"] else 1)
        assert set(doc["work"]) == {"naive", "cached", "repeated_share"}
        assert [d["kernels"] for d in doc["drifts"]] == (["exact", "fast"] if kernels == "exact" else ["fast"])


def test_cli_prove_runs_on_a_hugging_face_layout_checkpoint(tokenizer, tmp_path, capsys):
    config = GPT2Config(n_layer=2, n_embd=16, n_head=2, n_positions=64)
    save_checkpoint(tmp_path, config, random_params(config, seed=3))
    assert main(["prove", "--model", str(tmp_path), "--steps", "4"]) == 0
    assert "result: HOLDS" in capsys.readouterr().out


def exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as e:  # usage errors leave from argparse
        return e.code


@pytest.mark.parametrize("argv, code, message", [
    (["--steps", "1"], 2, "argument --steps: must be >= 2"),
    (["--steps", "x"], 2, "argument --steps: invalid int value"),
    (["--steps", "300"], 1, "n_positions"),
    (["--model", "no-such-model"], 1, "no directory"),
])
def test_cli_prove_reports_mistakes_in_one_line(tokenizer, capsys, argv, code, message):
    assert exit_code(["prove", "--model", "random-tiny", *argv]) == code
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err and err.count("\n") == 1
