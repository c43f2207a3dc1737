"""minigpt.loop.staircase and `python -m minigpt staircase`: smoke tests on random-tiny (no timing asserted)."""

from __future__ import annotations

import dataclasses
import json
import re
import sys

import numpy as np
import pytest

from minigpt.cli import main
from minigpt.errors import MinigptError
from minigpt.api.api import generate
from minigpt.gpt2.params import LayerNorm
from minigpt.cli.pictures import staircase as plot
from minigpt.loop.staircase import MODES, measure

TINY = ["staircase", "--model", "random-tiny", "--prompt-tokens", "3", "--new-tokens", "4"]


def test_measure_times_every_token_of_both_loops_and_predicts_from_the_shapes(tiny_model):
    s = measure(tiny_model, 3, 4)
    assert set(s.seconds) == set(MODES)
    assert all(len(s.seconds[mode]) == 4 and np.isfinite(s.seconds[mode]).all() for mode in MODES)
    assert (s.predicted.naive_tokens, s.predicted.cached_tokens) == (3 * 4 + 6, 3 + 4 - 1)
    assert s.predicted.arch.n_layer == tiny_model.config.n_layer


def test_measure_generates_past_end_of_text(tiny_model):
    """A measurement must not stop early: even a model that always predicts <|endoftext|> runs N steps."""
    C, eos = tiny_model.config.n_embd, tiny_model.config.eos_token_id
    ones = np.ones(C, np.float32)
    wte = tiny_model.params.wte.copy()
    wte[eos] = ones  # final hidden state = ln_f's bias = ones, so <|endoftext|> scores C, the rest ~0
    params = dataclasses.replace(tiny_model.params, wte=wte, ln_f=LayerNorm(np.zeros(C, np.float32), ones))
    model = dataclasses.replace(tiny_model, params=params)
    assert generate(model, [1, 2], 3).tokens == [eos]  # the premise: a normal run stops at once
    assert all(len(seconds) == 5 for seconds in measure(model, 2, 5).seconds.values())


def test_progress_callback_sees_every_token_of_both_loops(tiny_model):
    calls = []
    measure(tiny_model, 2, 3, lambda mode, done, seconds: calls.append((mode, done)))
    assert calls == [(mode, i) for mode in MODES for i in (1, 2, 3)]


def test_cli_json_keys_and_lengths(capsys):
    assert main([*TINY, "--json"]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert len(doc["naive_ms"]) == len(doc["cached_ms"]) == 4
    assert set(doc["summary"]["naive"]) == {"first_ms", "last_ms", "median_ms", "total_s"}
    assert doc["predicted_ratio"] == pytest.approx((3 * 4 + 6) / (3 + 4 - 1))
    assert doc["measured_ratio"] == pytest.approx(sum(doc["naive_ms"]) / sum(doc["cached_ms"]), rel=0.01)
    assert doc["summary"]["cached"]["total_s"] == pytest.approx(sum(doc["cached_ms"]) / 1e3, rel=0.01)
    assert doc["plot"] is None
    for mode in MODES:  # a progress bar per loop, on stderr
        assert re.search(rf"{mode}: 100%.* 4/4 ", captured.err), captured.err


def test_cli_text_prints_a_row_per_token_and_the_ratios(capsys):
    assert main(TINY) == 0
    out = capsys.readouterr().out
    assert "naive / cached total time" in out and "predicted 3.0x by tokens through the model (18 vs 6)" in out
    assert [line.split()[0] for line in out.splitlines() if line[:5].strip().isdigit()] == ["1", "2", "3", "4"]


def test_cli_plot_writes_a_png(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    path = tmp_path / "staircase.png"
    assert main([*TINY, "--plot", str(path)]) == 0
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot: {path}" in capsys.readouterr().out


def test_plot_without_matplotlib_is_a_clear_error_before_measuring(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    assert main([*TINY, "--plot", str(tmp_path / "x.png")]) == 1
    captured = capsys.readouterr()
    assert captured.err == "error: --plot needs matplotlib: pip install 'minigpt[plot]' (or pip install matplotlib)\n"
    assert captured.out == ""


def test_plot_function_without_matplotlib_raises_minigpt_error(tiny_model, tmp_path, monkeypatch):
    s = measure(tiny_model, 1, 2)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(MinigptError, match="matplotlib"):
        plot(s, tmp_path / "x.png", "title")


@pytest.mark.parametrize("argv, code, message", [
    ([*TINY, "--plot", "/no/such/dir/x.png"], 2, "error: argument --plot: '/no/such/dir/x.png': there is no directory"),
    (["staircase", "--model", "random-tiny", "--prompt-tokens", "250", "--new-tokens", "10"], 2,
     "error: argument --prompt-tokens: prompt of 250 tokens + 10 new tokens need 259 positions (the last new token is never fed), beyond "
     "the context of 256"),
    (["staircase", "--model", "random-tiny", "--new-tokens", "0"], 2, "error: argument --new-tokens"),
    (["staircase", "--model", "no-such-model"], 1, "error: no directory 'no-such-model'"),
])
def test_cli_errors_are_one_line_and_nonzero(argv, code, message, capsys):
    try:
        result = main(argv)
    except SystemExit as e:  # argparse's usage errors
        result = e.code
    assert result == code
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
