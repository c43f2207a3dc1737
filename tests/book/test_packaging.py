"""The package as installed: `pip install .` must ship every subpackage (the CLI is one)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_setup_cfg_ships_every_package_of_the_source_tree(monkeypatch):
    setupcfg = pytest.importorskip("setuptools.config.setupcfg", reason="setuptools reads setup.cfg here")
    monkeypatch.chdir(ROOT)
    packages = set(setupcfg.read_configuration("setup.cfg")["options"]["packages"])
    in_tree = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "minigpt").rglob("__init__.py")}
    assert packages == in_tree


def test_setup_cfg_ships_gpt2s_bpe_tables_their_licence_and_the_page(monkeypatch):
    """The packaged tables and the server's page are package data: a non-editable `pip install .` carries them."""
    setupcfg = pytest.importorskip("setuptools.config.setupcfg", reason="setuptools reads setup.cfg here")
    monkeypatch.chdir(ROOT)
    shipped = set(setupcfg.read_configuration("setup.cfg")["options"]["package_data"]["minigpt"])
    assert shipped == {"gpt2_bpe/encoder.json", "gpt2_bpe/vocab.bpe", "gpt2_bpe/LICENSE", "gpt2_bpe/README.md",
                       "server/page/*"}
    assert all((ROOT / "minigpt" / name).is_file() for name in shipped - {"server/page/*"})
    assert {p.name for p in (ROOT / "minigpt" / "server" / "page").iterdir()} == {"index.html", "page.css", "page.js"}
