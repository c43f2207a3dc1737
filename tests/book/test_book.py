"""The book's layout is its table of contents: the parts are packages, listed in order by minigpt's
docstring; each part's docstring lists its modules in reading order; the README's table agrees, no
module imports one of a later part (or a later module of its own part), and part 1 is plain."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "minigpt"
PART_1_WORDS = re.compile(r"page|slot|span|segment", re.IGNORECASE)  # the engine's vocabulary


def docstring_rows(path: Path, heading: str | None = None) -> list[list[str]]:
    """The indented `name  text` rows of a module's docstring (after `heading`, if given)."""
    text = ast.get_docstring(ast.parse(path.read_text()))
    if heading:
        text = text.split(heading, 1)[1]
    return [line.split() for line in text.splitlines() if re.match(r"    \w+\s{2,}\S", line)]


def parts() -> list[tuple[str, int]]:
    """(package, part number) in reading order, from minigpt/__init__.py ("errors" is a module)."""
    return [(row[0], int(row[1].rstrip("."))) for row in docstring_rows(PACKAGE / "__init__.py")]


def modules_of(package: str) -> list[str]:
    """A part's modules in reading order, from its __init__'s docstring."""
    if package == "errors":
        return ["errors"]
    if package == "cli":
        return sorted(p.stem for p in (PACKAGE / "cli").glob("*.py") if p.name != "__init__.py")
    return [row[0] for row in docstring_rows(PACKAGE / package / "__init__.py", "in reading order:")]


def reading_order() -> dict[tuple[str, str], int]:
    """(package, module) -> its place in the book; cli's modules share one place (its commands are apart)."""
    order, place = {}, 0
    for package, _ in parts():
        for module in modules_of(package):
            order[(package, module)] = place
            place += package != "cli"
        place += 1
    return order


def location(path: Path) -> tuple[str, str]:
    relative = path.relative_to(PACKAGE)
    return (relative.parts[0], relative.stem) if len(relative.parts) > 1 else (relative.stem, relative.stem)


def imported(path: Path) -> set[tuple[str, str]]:
    """The (package, module) pairs a file of the package imports, resolved from its relative imports."""
    package = location(path)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom) or not node.level:
            continue
        dotted = (node.module or "").split(".") if node.module else []
        base = [package] if node.level == 1 else []
        names = base + dotted
        if len(names) >= 2:
            found.add((names[0], names[1]))
        elif len(names) == 1 and names[0] in ("errors",):
            found.add(("errors", "errors"))
        else:
            found.update((names[0], alias.name) for alias in node.names)
    return found


def sources() -> list[Path]:
    return [p for p in PACKAGE.rglob("*.py") if p.parent != PACKAGE or p.stem == "errors"
                                                 if p.name != "__init__.py" or p.parent.name == "cli"]


def test_every_module_is_listed_once_by_its_part_in_the_tree():
    listed = reading_order()
    found = {location(p) for p in sources()} - {("cli", "__init__")}
    assert found == set(listed), f"not listed: {found - set(listed)}; listed only: {set(listed) - found}"


def test_the_readme_table_lists_the_tree_s_parts_and_modules_in_its_order():
    section = ROOT.joinpath("README.md").read_text().split("## The book", 1)[1].split("\n## ", 1)[0]
    rows, part = [], None
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("["):
            continue
        if cells[0]:
            part = int(re.match(r"\**(\d+)\.", cells[0].lstrip("*"))[1])
        for target in re.findall(r"\]\(minigpt/([\w/]+?)(?:\.py|/)\)", cells[1]):
            rows.append((part, tuple(target.split("/")) if "/" in target else (target, target)))
    tree = [(number, (package, module) if package != "cli" else ("cli", "cli")) for package, number in parts()
            for module in (modules_of(package) if package != "cli" else ["cli"])]
    assert rows == tree


def test_no_module_imports_a_later_part_or_a_later_module_of_its_own_part():
    order, later = reading_order(), []
    for path in sources():
        mine = location(path)
        place = order.get(mine, order.get(("cli", "common")))
        for other in imported(path) - {("errors", "errors"), mine}:
            if other[0] == "cli" and mine[0] == "cli":
                continue
            if order[other] >= place:
                later.append(f"{path.relative_to(ROOT)} imports {'.'.join(other)}, later in the book")
    assert not later, "\n".join(later)


def code_lines(path) -> int:
    """Lines of a module that are neither blank, nor comments, nor docstrings."""
    source = path.read_text()
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(node):
            docstrings.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    return sum(1 for i, line in enumerate(source.splitlines(), 1)
               if line.strip() and not line.strip().startswith("#") and i not in docstrings)


def test_no_module_is_over_300_code_lines():
    long = {str(p.relative_to(ROOT)): n for p in PACKAGE.rglob("*.py") if (n := code_lines(p)) > 300}
    assert long == {}


def test_part_1_is_gpt2_plainly_no_validation_no_engine_vocabulary_at_most_300_code_lines():
    files = [PACKAGE / "gpt2" / f"{name}.py" for name in modules_of("gpt2")]
    for path in files:
        source = path.read_text()
        tree = ast.parse(source)
        assert not [n for n in ast.walk(tree) if isinstance(n, ast.Raise)], f"{path.name} raises"
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | {
            n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | {
            n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))} | {
            a.arg for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) for a in n.args.args}
        assert not [n for n in names if PART_1_WORDS.search(n)], f"{path.name}: {sorted(names)}"
    total = sum(code_lines(path) for path in files)
    assert len(files) >= 4 and total <= 300, total


def test_part_2_is_a_diff_of_part_1_no_raise_no_engine_vocabulary():
    """The KV cache adds to part 1 only what a cache adds (rasbt's chapter): no check, and no page,
    slot or segment anywhere in its text, docstrings and comments included."""
    for name in modules_of("cache"):
        path = PACKAGE / "cache" / f"{name}.py"
        source = path.read_text()
        assert not [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Raise)], f"{path.name} raises"
        assert not PART_1_WORDS.findall(source), f"{path.name}: {PART_1_WORDS.findall(source)}"


def test_no_test_module_imports_another_test_module():
    """Shared fixtures live in tests/conftest.py, shared helpers in helpers modules (tests/serving.py,
    tests/commands.py, ...): a test module (test_*.py) is never imported, so each can be read, run and
    moved alone."""
    imports = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)  # import test_x
                     else [node.module or "", *(alias.name for alias in node.names)]  # from . import test_x
                     if isinstance(node, ast.ImportFrom) else [])
            imports += [f"{path.relative_to(ROOT)}:{node.lineno} imports {name}" for name in names
                        if name.rsplit(".", 1)[-1].startswith("test_")]
    assert imports == []


def test_every_test_module_sits_in_its_part_s_folder():
    """tests/ follows the book: a folder per part (named as its package), tests/book for the book's own
    checks and tests/properties for the bitwise properties that span the parts; the helpers stay at the top."""
    folders = {package for package, _ in parts()} | {"book", "properties"}
    misplaced = [str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                 if p.parent.parent != ROOT / "tests" or p.parent.name not in folders]
    assert misplaced == []
