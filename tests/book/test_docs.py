"""Every measured figure the prose quotes comes from a block the benchmark wrote.

The convention. scripts/benchmark.py writes markdown between `<!-- benchmark[:SECTION]:begin -->` and
`<!-- benchmark[:SECTION]:end -->` markers. Outside those blocks and outside fenced code (command
lines and the output of one run, shown as such), a number followed by a unit of time, speed or
ratio (`x`, `times`, `ms`, `s`, `tokens/s`, `GB/s`, `%`) is a quoted measurement. It must be a
number of a block in scope, rounded to the decimals the prose gives (the block's 9.77 may be quoted
as 9.8x or 9.77; a block's "1.54x" as 1.54x). In scope: the chapter's own blocks and the decode
block of docs/benchmarks.md; for README.md, every block. A range ("1.1 to 1.3 times") quotes both
ends. Figures that are not measurements (the lessons' own, cost arithmetic that tests/loop/test_cost.py
checks, sizes of the machine) are listed in NOT_MEASURED, each with its reason. Memory sizes (MB,
MiB, ...) are arithmetic in this book and are not checked here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"<!-- benchmark(?::[\w-]+)?:begin -->(.*?)<!-- benchmark(?::[\w-]+)?:end -->", re.S)
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
UNIT = r"(?:x|times|ms|s|tokens/s|GB/s|%)(?![\w/])(?!\s*\d)"  # "3072 x 768" is a shape
# "12 ms", "9.8x", "0.40 times", "1.1 to 1.3 times", "13.0 / 126.7 ms", "1.5-3x"
FIGURE = re.compile(rf"(?<![\w.,/-])((?:(?:{NUMBER})\s*(?:to|-|–|/|and|or|vs)\s*)*(?:{NUMBER}))\s*({UNIT})")
# The chapters whose prose is checked: the book's own chapters (not the reference pages of others).
CHAPTERS = ["README.md", "model.md", "kv-cache.md", "the-loop.md", "staircase.md", "measurement.md", "exactness.md",
            "paging.md", "batching.md", "prefix-cache.md", "speculative.md", "benchmarks.md"]

NOT_MEASURED = {
    # "The Autoregressive Loop & Cost": the lesson's own measurement of plain GPT-2, labelled as the lesson's
    ("*", "147 ms"), ("*", "64 to 147 ms"), ("*", "2.3 times"),
    # lesson 03-01's arithmetic, redone by `cost` (tests/loop/test_cost.py)
    ("*", "461 times"), ("*", "1,000 times"), ("*", "461x"), ("*", "967x"), ("*", "213x"), ("*", "1,000x"),
    ("*", "84.8%"),  # the proof's own count: 112 of 132 token-positions (arithmetic, printed by `prove`)
    # weight scales of the property tests (x Hugging Face's initialisation), not timings
    ("*", "30x"), ("*", "1000x"), ("*", "30 times"), ("*", "1000 times"),
    # exactness.md: the tuning's shares of the L2 cache (minigpt/exact/tuning.py's defaults), not timings
    ("exactness.md", "60%"), ("exactness.md", "40%"),
}


def blocks(text: str) -> list[str]:
    return BLOCK.findall(text)


def numbers(text: str) -> list[str]:
    return [n.replace(",", "") for n in re.findall(NUMBER, text)]


def prose(text: str) -> str:
    """The text outside generated blocks and fenced code."""
    return FENCE.sub("", BLOCK.sub("", text))


def quoted(text: str) -> list[tuple[str, list[str]]]:
    """Each figure the prose quotes: (as written, its numbers)."""
    return [(m.group(0), numbers(m.group(1))) for m in FIGURE.finditer(prose(text))]


def matches(value: str, block_numbers: list[str]) -> bool:
    decimals = len(value.split(".")[1]) if "." in value else 0
    return any(round(float(b), decimals) == float(value) for b in block_numbers)


def scope(name: str) -> list[str]:
    benchmarks = blocks((DOCS / "benchmarks.md").read_text())
    if name == "README.md":
        return [b for p in DOCS.glob("*.md") for b in blocks(p.read_text())]
    return blocks((DOCS / name).read_text()) + benchmarks


def path(name: str) -> Path:
    return ROOT / name if name == "README.md" else DOCS / name


def unmatched(name: str, text: str, in_scope: list[str]) -> list[str]:
    block_numbers = [n for b in in_scope for n in numbers(b)]
    allowed = {figure for chapter, figure in NOT_MEASURED if chapter in ("*", name)}
    return [written for written, values in quoted(text)
            if " ".join(written.split()) not in allowed and not all(matches(v, block_numbers) for v in values)]


def test_there_are_blocks_to_quote():
    assert blocks((DOCS / "benchmarks.md").read_text()), "docs/benchmarks.md has no benchmark block"
    for name in ("batching.md", "paging.md", "speculative.md"):
        assert blocks((DOCS / name).read_text()), f"docs/{name} lost its benchmark block"


@pytest.mark.parametrize("name", CHAPTERS)
def test_every_quoted_figure_is_in_a_block(name):
    bad = unmatched(name, path(name).read_text(), scope(name))
    assert not bad, f"{name}: figures in the prose that no benchmark block in scope has: {bad}"


def test_the_check_can_fail():
    block = "<!-- benchmark:begin -->\n| staircase | 9.77 | 4.08 |\n| decode | 10.07 ms |\n<!-- benchmark:end -->"
    assert unmatched("x.md", block + "\nToken 40 takes 9.8x token 1, a step 10.07 ms.", blocks(block)) == []
    assert unmatched("x.md", block + "\nToken 40 takes 7.6x token 1.", blocks(block)) == ["7.6x"]
    assert unmatched("x.md", block + "\nat 1.1 to 1.3 times the floor", blocks(block)) == ["1.1 to 1.3 times"]
    assert unmatched("x.md", block + "\n```\nnaive 17.1 ms\n```\n", blocks(block)) == []  # a run's output
    assert unmatched("x.md", "it took 12 ms", []) == ["12 ms"]


def test_the_readmes_how_fast_table_quotes_the_blocks():
    """The README's table of figures has no units in its cells: every number in it is checked."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## How fast", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|") and not set(line) <= set("|-: ")]
    block_numbers = [n for b in scope("README.md") for n in numbers(b)]
    cells = [n for row in rows for n in numbers(row)]
    assert len(cells) > 15, "the README's How fast table is missing"
    assert [n for n in cells if not matches(n, block_numbers)] == []


def test_every_relative_link_resolves():
    broken = []
    for page in [ROOT / "README.md", *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def test_the_chapters_are_one_chain_of_next_links_in_the_books_order():
    """docs/README.md lists every chapter; each ends with Next: the one listed after it, the last
    back to the list."""
    index = (DOCS / "README.md").read_text().split("## The chapters", 1)[1]
    order = list(dict.fromkeys(re.findall(r"\]\((\w[\w-]*\.md)\)", index)))
    assert sorted(order) == sorted(p.name for p in DOCS.glob("*.md") if p.name != "README.md")
    for name, following in zip(order, [*order[1:], "README.md"]):
        last = (DOCS / name).read_text().strip().split("\n\n")[-1]
        found = re.search(r"Next: .*\]\((\w[\w-]*\.md)\)", last)
        assert found and found.group(1) == following, f"{name} should end with Next: a link to {following}"
