"""The book's layout is its table of contents: the README's table of parts, the import graph and
part 1's plainness, checked against the code."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minigpt"
PART_1_WORDS = re.compile(r"page|slot|span|segment", re.IGNORECASE)  # the engine's vocabulary


def parts() -> dict[str, int]:
    """module name -> its part number, read from the README's table ("cli" for the package)."""
    table, part = {}, None
    section = ROOT.joinpath("README.md").read_text().split("## The book", 1)[1].split("\n## ", 1)[0]
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("["):
            continue
        if cells[0]:
            part = int(re.match(r"\**(\d+)\.", cells[0].lstrip("*"))[1])
        for target in re.findall(r"\]\(minigpt/([\w/]+?)(?:\.py|/)\)", cells[1]):
            table[target] = part
    return table


def module_of(path: Path) -> str:
    relative = path.relative_to(PACKAGE)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def imported(path: Path) -> set[str]:
    """The minigpt modules a file imports (relative imports, resolved to top-level module names)."""
    names, inside_cli = set(), path.parent.name == "cli"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            in_package = node.level == 1 and not inside_cli or node.level == 2 and inside_cli
            if node.module:
                top = node.module.split(".")[0]
                names.add("cli" if not in_package else top)
            elif in_package:
                names.update(alias.name for alias in node.names)
            else:
                names.add("cli")
    return names


def sources() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if p.name not in ("__init__.py", "__main__.py") or p.parent.name == "cli"]


def test_every_module_is_in_the_readme_table_once():
    table = parts()
    modules = {module_of(p) for p in sources()}
    assert modules == set(table), f"not in the table: {modules - set(table)}; in the table only: {set(table) - modules}"


def test_no_module_imports_a_module_of_a_later_part():
    table, later = parts(), []
    for path in sources():
        mine = table[module_of(path)]
        for name in imported(path) - {"errors", module_of(path)}:
            if table[name] > mine:
                later.append(f"{path.relative_to(ROOT)} (part {mine}) imports {name} (part {table[name]})")
    assert not later, "\n".join(later)


def test_part_1_is_gpt2_plainly_no_validation_no_engine_vocabulary_at_most_300_code_lines():
    files = [PACKAGE / f"{name}.py" for name, part in parts().items() if part == 1]
    code_lines = 0
    for path in files:
        source = path.read_text()
        tree = ast.parse(source)
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Raise)], f"{path.name} raises"
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
            n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
            n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
            a.arg for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) for a in n.args.args}
        assert not [n for n in names if PART_1_WORDS.search(n)], f"{path.name}: {sorted(names)}"
        docstrings = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node):
                docstrings.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
        code_lines += sum(1 for i, line in enumerate(source.splitlines(), 1)
                          if line.strip() and not line.strip().startswith("#") and i not in docstrings)
    assert len(files) >= 4 and code_lines <= 300, code_lines
