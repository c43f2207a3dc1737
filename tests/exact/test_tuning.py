"""The tuning of the exact kernels: defaults from the machine's caches, a measured choice kept per
machine in the user's cache directory, MINIGPT_TUNING=off, and the tune command."""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import asdict

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
    # several rows: blocks of 40% of L2 shared between minigpt's two threads, from 2 rows on
    assert tuning.machine_default() == Tuning(32 * 2**20 // 4, int(0.6 * 2**21) // 4, int(0.4 * 2**21) // 4, 2, 16)
    monkeypatch.setattr(tuning, "threads", lambda: 1)
    # one thread: no sharing, blocks of 60% of its L2
    assert tuning.machine_default().shared_rows == tuning.NEVER
    assert tuning.current() == tuning.machine_default()


def test_a_kept_choice_is_used_for_this_machine_only_and_off_ignores_it(cache_home, monkeypatch):
    choice = Tuning(1000, 2000, 3000, 3, 4)
    path = tuning.keep(choice)
    assert path == cache_home / "minigpt" / "tuning.json"
    assert json.loads(path.read_text())[tuning.key()] == {"one_row_block": 1000, "multi_row_block": 2000,
                                                          "shared_block": 3000, "shared_rows": 3, "gemm_rows": 4}
    assert tuning.current() == choice
    monkeypatch.setenv("MINIGPT_TUNING", "off")
    tuning.current.cache_clear()
    assert tuning.current() == tuning.machine_default()


def hostile_kept_files(path, key):
    """What can stand at the kept tuning's path instead of a file of kept choices."""
    fields = {"one_row_block": 1000, "multi_row_block": 2000, "shared_block": 3000, "shared_rows": 3, "gemm_rows": 4}
    yield "not json", lambda: path.write_text("{not json")
    yield "a list", lambda: path.write_text("[]")
    yield "deep nesting", lambda: path.write_text("[" * 100_000 + "]" * 100_000)
    yield "a duplicate key", lambda: path.write_text('{"%s": %s, "%s": %s}' % (key, json.dumps(fields), key, json.dumps(fields)))
    for name, value in (("a string", "big"), ("NaN", float("nan")), ("a bool", True), ("zero", 0), ("a float", 2.5)):
        yield f"{name} for a block size", lambda value=value: path.write_text(
            json.dumps({key: {**fields, "one_row_block": value}}))
    yield "a missing field", lambda: path.write_text(json.dumps({key: {"one_row_block": 5}}))
    yield "a FIFO", lambda: os.mkfifo(path)
    yield "a link to /dev/zero", lambda: path.symlink_to("/dev/zero")
    yield "a directory", lambda: path.mkdir()
    yield "a huge file", lambda: path.write_bytes(b" " * (tuning.KEPT_BYTES + 1))


def test_a_kept_tuning_that_is_not_a_file_of_kept_choices_is_ignored_with_one_warning_line(cache_home, capfd):
    """Whatever stands at the path, the defaults are used at once (no hang, no endless read, no
    traceback) and one line on stderr names the file."""
    path = cache_home / "minigpt" / "tuning.json"
    for case, make in hostile_kept_files(path, tuning.key()):
        path.parent.mkdir(exist_ok=True)
        make()
        tuning.current.cache_clear()
        assert tuning.current() == tuning.machine_default(), case
        lines = capfd.readouterr().err.splitlines()
        assert len(lines) == 1 and str(path) in lines[0] and "using the defaults" in lines[0], (case, lines)
        shutil.rmtree(path.parent)


def test_keeping_a_choice_replaces_a_bad_file_and_keeps_other_machines_entries(cache_home):
    path = cache_home / "minigpt" / "tuning.json"
    for case, make in hostile_kept_files(path, tuning.key()):
        path.parent.mkdir(exist_ok=True)
        make()
        if path.is_dir():  # not replaced: keep says it cannot write there
            with pytest.raises(OSError):
                tuning.keep(Tuning(1, 2, 3, 4, 5))
            shutil.rmtree(path.parent)
            continue
        assert tuning.keep(Tuning(1, 2, 3, 4, 5)) == path, case
        assert path.is_file() and not path.is_symlink(), case
        assert tuning.read_kept(path) == {tuning.key(): asdict(Tuning(1, 2, 3, 4, 5))}, case
        shutil.rmtree(path.parent)
    path.parent.mkdir()
    path.write_text(json.dumps({"another machine": asdict(Tuning(9, 9, 9, 9, 9))}))
    tuning.keep(Tuning(1, 2, 3, 4, 5))
    assert set(tuning.read_kept(path)) == {"another machine", tuning.key()}


def test_concurrent_keeps_and_reads_see_whole_files_and_lose_no_entry(cache_home, monkeypatch):
    """Writers in threads, each keeping under its own machine key, while a reader reads: every
    read is a whole file of kept choices, and every writer's entry is there at the end."""
    path, errors, names = cache_home / "minigpt" / "tuning.json", [], {}
    monkeypatch.setattr(tuning, "key", lambda: names.get(threading.get_ident(), "reader"))

    def writer(n):
        names[threading.get_ident()] = f"machine {n}"
        for i in range(20):
            tuning.keep(Tuning(n + 1, i + 1, 1, 1, 1))

    writers = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for w in writers:
        w.start()
    while any(w.is_alive() for w in writers):
        try:
            tuning.read_kept(path)
        except ValueError as e:
            errors.append(e)
    for w in writers:
        w.join()
    assert not errors and set(tuning.read_kept(path)) == {f"machine {n}" for n in range(4)}


def test_measure_returns_a_choice_and_the_seconds_of_every_candidate():
    choice, report = tuner.measure(n_embd=16, vocab_size=300)
    assert isinstance(choice, Tuning) and choice.multi_row_block > 0 and choice.shared_rows >= 2 and choice.gemm_rows >= 2
    assert all(seconds and all(s > 0 for s in seconds.values()) for seconds in report.values())


def test_the_tune_command_keeps_what_it_measured(cache_home, monkeypatch, capsys):
    monkeypatch.setattr("minigpt.cli.tune.measure", lambda n_embd, vocab_size: (Tuning(64, 128, 32, 4, 8), {"x": {"a": 1.0}}))
    assert main(["tune", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["choice"] == {"one_row_block": 64, "multi_row_block": 128, "shared_block": 32, "shared_rows": 4, "gemm_rows": 8}
    assert tuning.current() == Tuning(64, 128, 32, 4, 8)
