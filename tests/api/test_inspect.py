"""minigpt.inspect and the pictures: attention rows are distributions with the future exactly 0, the
logits are bitwise the forward's, the hidden states the proof's, the logit lens's last layer the
model's own prediction; and every picture command writes an image from data checked here."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import minigpt
from minigpt.cli import main, pictures
from minigpt.errors import ContextLengthError, InputError
from minigpt.exact.causal_proof import record_forward
from requesting import new_request
from minigpt.exact.tracing import layer_names
from minigpt.gpt2.forward import embed
from minigpt.loop.sampling import log_softmax

PNG = b"\x89PNG\r\n\x1a\n"
IDS = [464, 3290, 4966, 284, 262, 3952, 290, 788]


@pytest.fixture(scope="module")
def found(tiny_model):
    return minigpt.inspect(tiny_model, IDS)


def test_attention_rows_are_distributions_over_the_past_and_the_future_is_exactly_zero(tiny_model, found):
    config, T = tiny_model.config, len(IDS)
    assert found.attention.dtype == np.float32 and found.attention.shape == (config.n_layer, config.n_head, T, T)
    np.testing.assert_allclose(found.attention.sum(-1), 1.0, atol=1e-6)
    future = np.triu(np.ones((T, T), bool), 1)
    assert (found.attention[..., future].view(np.uint32) == 0).all()  # +0.0 exactly


def test_logits_are_bitwise_the_forward_s_and_hidden_states_the_proof_s(tiny_model, found):
    assert np.array_equal(found.logits.view(np.uint32), tiny_model.forward(IDS).view(np.uint32))
    assert found.hidden.dtype == np.float32 and found.hidden.shape == (tiny_model.config.n_layer + 1, len(IDS), 64)
    assert np.array_equal(found.hidden[0], embed(tiny_model.params, IDS))
    snapshot = record_forward(tiny_model, IDS)
    for layer, name in enumerate(layer_names(tiny_model.config.n_layer)[:-1]):
        assert np.array_equal(found.hidden[layer].view(np.uint32), snapshot[name, "hidden"].view(np.uint32)), name


def test_the_logit_lens_s_last_layer_is_the_model_s_own_prediction(tiny_model, found):
    ids, probs = found.logit_lens(top=3)
    assert ids.shape == probs.shape == (tiny_model.config.n_layer + 1, len(IDS), 3)
    assert (np.diff(probs, axis=-1) <= 0).all()  # most likely first
    for t, row in enumerate(found.logits):
        p = np.exp(log_softmax(row))
        assert ids[-1, t, 0] == int(np.argmax(row)) and probs[-1, t, 0] == p[ids[-1, t, 0]]


@given(cut=st.integers(1, len(IDS) - 1))
def test_inspecting_a_prefix_gives_bitwise_the_first_rows_of_inspecting_the_whole(tiny_model, found, cut):
    """Causality, seen through inspect: later tokens change nothing at earlier positions (exact kernels)."""
    part = minigpt.inspect(tiny_model, IDS[:cut])
    assert np.array_equal(part.hidden.view(np.uint32), found.hidden[:, :cut].view(np.uint32))
    assert np.array_equal(part.attention.view(np.uint32), found.attention[:, :, :cut, :cut].view(np.uint32))


@pytest.mark.parametrize("ids, error, message", [
    ([], ContextLengthError, "inspect takes 1 to 256 token ids"),
    (list(range(257)), ContextLengthError, "got 257"),
    ([50257], InputError, "50257"),
])
def test_bad_ids_are_refused_before_any_work(tiny_model, ids, error, message):
    with pytest.raises(error, match=message):
        minigpt.inspect(tiny_model, ids)


def cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_the_inspect_command_prints_the_lens_and_its_json_agrees_with_the_api(tiny_model, found, capsys):
    code, out, _ = cli(capsys, "inspect", "The dog ran", "--model", "random-tiny")
    assert code == 0 and "the logit lens" in out and "block 1" in out
    code, out, _ = cli(capsys, "inspect", "The dog ran", "--model", "random-tiny", "--json", "--top", "2", "--attention")
    document = json.loads(out)
    mine = minigpt.inspect(tiny_model, document["ids"])
    ids, probs = mine.logit_lens(top=2)
    assert document["layers"] == ["embeddings", "block 0", "block 1"]
    assert [[[c["id"] for c in cell] for cell in row] for row in document["logit_lens"]] == ids.tolist()
    assert [[[c["prob"] for c in cell] for cell in row] for row in document["logit_lens"]] == probs.tolist()
    assert document["attention"] == mine.attention.tolist()


@pytest.mark.parametrize("argv, message, status", [
    (["--layer", "2"], "--layer 2: this model has 2 (0 .. 1)", 1),
    (["--attention"], "only with --json", 2),
    (["--plot", "/no/such/dir"], "is not a directory", 2),
])
def test_the_inspect_command_refuses_what_the_model_does_not_have(capsys, argv, message, status):
    code, _, err = cli(capsys, "inspect", "The dog", "--model", "random-tiny", *argv)
    assert code == status and message in err and err.count("\n") == 1


def test_inspect_draws_attention_and_the_lens(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    assert cli(capsys, "inspect", "The dog ran", "--model", "random-tiny", "--plot", str(tmp_path))[0] == 0
    assert cli(capsys, "inspect", "The dog ran", "--model", "random-tiny", "--layer", "1", "--head", "0",
               "--plot", str(tmp_path))[0] == 0
    for name in ("attention.png", "logit-lens.png", "attention-layer1-head0.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG, name


def test_prove_draws_the_proof_zeros_for_the_exact_kernels(tiny_model, capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    code, _, _ = cli(capsys, "prove", "--model", "random-tiny", "--steps", "3", "--plot", str(tmp_path / "p.png"))
    assert code == 0 and (tmp_path / "p.png").read_bytes()[:8] == PNG
    proof = minigpt.prove(tiny_model, IDS, 3)
    exact, fast = proof.drifts
    assert len(exact.grid) == tiny_model.config.n_layer + 3 and all(len(row) == 3 for row in exact.grid)
    assert max(map(max, exact.grid)) == 0.0  # the exact kernels: every bit equal
    assert max(map(max, fast.grid)) == fast.scale_ulp or fast.scale_ulp > 0


def test_batch_draws_the_page_pool_from_stats_that_add_up(tiny_model, capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    lines = tmp_path / "in.jsonl"
    lines.write_text("".join(json.dumps({"prompt_ids": [7] * 20 + [i]}) + "\n" for i in range(4)))
    code, _, _ = cli(capsys, "batch", str(lines), "--model", "random-tiny", "--max-new-tokens", "20",
                     "--kv-cache-tokens", "96", "--plot", str(tmp_path / "pool.png"), "-o", str(tmp_path / "out"))
    assert code == 0 and (tmp_path / "pool.png").read_bytes()[:8] == PNG
    samples = []
    engine = minigpt.Engine(tiny_model, max_batch_size=4, kv_cache_tokens=96)
    list(engine.results(engine.jobs_for([new_request(tiny_model, [7] * 20 + [i], 20, stop_at_eos=False)
                                         for i in range(4)]), lambda n: samples.append(engine.stats())))
    assert samples and all(s["pages_in_use"] + s["pages_cached"] + s["pages_free"] == s["pages_total"] for s in samples)
    assert samples[-1]["preemptions"] > 0 and samples[-1]["pages_cached"] > 0
    pictures.pool(samples, tmp_path / "again.png", "the same run")
    assert (tmp_path / "again.png").read_bytes()[:8] == PNG
