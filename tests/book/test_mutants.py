"""scripts/mutants.py stays runnable: every bug's snippet occurs exactly once in its file (code that
moved must have its bug written again), and every test it names exists. The bugs themselves are
not run here: that takes minutes (docs/testing.md)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import mutants  # noqa: E402


def test_every_bug_s_snippet_occurs_exactly_once_in_its_file():
    assert not mutants.check_snippets(mutants.MUTANTS)


def test_every_guarding_test_exists_and_every_bug_has_a_name_of_its_own():
    names = [m.name for m in mutants.MUTANTS]
    assert len(names) == len(set(names)) and len(names) >= 25
    for m in mutants.MUTANTS:
        for test in m.tests:
            file, _, function = test.partition("::")
            assert (ROOT / file).is_file(), test
            if function:
                defined = {n.name for n in ast.walk(ast.parse((ROOT / file).read_text())) if isinstance(n, ast.FunctionDef)}
                assert function in defined, test


def test_docs_testing_lists_every_bug_with_its_guards():
    chapter = (ROOT / "docs" / "testing.md").read_text()
    for m in mutants.MUTANTS:
        assert f"| {m.name} |" in chapter, m.name
