"""The tuning of the exact kernels: defaults from the machine's caches, a measured choice kept per
machine in the user's cache directory, MINIGPT_TUNING=off, and the tune command."""

from __future__ import annotations

import json

import pytest

from minigpt.exact import tuner, tuning
from minigpt.cli import main
from minigpt.exact.tuning import Tuning


@pytest.fixture
def cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("MINIGPT_TUNING", raising=False)
    tuning.current.cache_clear()
    yield tmp_path
    tuning.current.cache_clear()


def test_the_default_comes_from_the_caches_the_kernel_reports(cache_home, monkeypatch):
    monkeypatch.setattr(tuning, "cache_bytes", lambda level: {2: 2**21, 3: 2**27}[level])
    monkeypatch.setattr(tuning, "threads", lambda: 2)
    # 60% of L2 per thread is 629,145 weights for two threads: enough for OpenBLAS to split
    assert tuning.machine_default() == Tuning(32 * 2**20 // 4, int(0.6 * 2**21) * 2 // 4, int(0.4 * 2**21) // 4,
                                              tuning.NEVER, 16)
    monkeypatch.setattr(tuning, "cache_bytes", lambda level: {2: 2**20, 3: 2**27}[level])
    # 1 MiB of L2: blocks too small for OpenBLAS to split are shared between minigpt's threads
    assert tuning.machine_default().shared_rows == 2
    assert tuning.current() == tuning.machine_default()


def test_a_kept_choice_is_used_for_this_machine_only_and_off_ignores_it(cache_home, monkeypatch):
    choice = Tuning(1000, 2000, 3000, 3, 4)
    path = tuning.keep(choice)
    assert path == cache_home / "minigpt" / "tuning.json"
    assert json.loads(path.read_text())[tuning.key()] == {"row_block": 1000, "rows_block": 2000,
                                                          "shared_block": 3000, "shared_rows": 3, "gemm_rows": 4}
    assert tuning.current() == choice
    monkeypatch.setenv("MINIGPT_TUNING", "off")
    tuning.current.cache_clear()
    assert tuning.current() == tuning.machine_default()


def test_a_damaged_file_of_kept_choices_is_ignored(cache_home):
    (cache_home / "minigpt").mkdir()
    (cache_home / "minigpt" / "tuning.json").write_text("{not json")
    assert tuning.current() == tuning.machine_default()


def test_measure_returns_a_choice_and_the_seconds_of_every_candidate():
    choice, report = tuner.measure(n_embd=16, vocab_size=300)
    assert isinstance(choice, Tuning) and choice.rows_block > 0 and choice.shared_rows >= 2 and choice.gemm_rows >= 2
    assert all(seconds and all(s > 0 for s in seconds.values()) for seconds in report.values())


def test_the_tune_command_keeps_what_it_measured(cache_home, monkeypatch, capsys):
    monkeypatch.setattr("minigpt.cli.tune.measure", lambda n_embd, vocab_size: (Tuning(64, 128, 32, 4, 8), {"x": {"a": 1.0}}))
    assert main(["tune", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["choice"] == {"row_block": 64, "rows_block": 128, "shared_block": 32, "shared_rows": 4, "gemm_rows": 8}
    assert tuning.current() == Tuning(64, 128, 32, 4, 8)
