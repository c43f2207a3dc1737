"""docs/api.md documents the public surface: every name of minigpt.__all__, every public method of its
classes, and every keyword of its functions and methods, so that a name a script needs cannot be
added without its contract."""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import minigpt

API = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text(encoding="utf-8")


def public_callables():
    """(name, callable) for every public function of minigpt and public method of its classes."""
    for name in minigpt.__all__:
        obj = getattr(minigpt, name)
        if inspect.isfunction(obj):
            yield name, obj
        elif inspect.isclass(obj):
            for method, member in inspect.getmembers(obj, inspect.isfunction):
                if not method.startswith("_"):
                    yield f"{name}.{method}", member


def test_every_public_name_method_field_and_keyword_is_documented():
    missing = [name for name in minigpt.__all__ if f"minigpt.{name}" not in API]
    for name, function in public_callables():
        method = name.rsplit(".", 1)[-1]
        if f"{method}(" not in API and f"`{method}`" not in API:
            missing.append(name)
        missing += [f"{name}({p})" for p in inspect.signature(function).parameters
                    if p not in ("self", "args", "kwargs") and f"`{p}`" not in API and f"{p}=" not in API
                    and f"({p}" not in API and f", {p}" not in API]
    for name in minigpt.__all__:
        obj = getattr(minigpt, name)
        if dataclasses.is_dataclass(obj):
            missing += [f"{name}.{f.name}" for f in dataclasses.fields(obj) if f"`{f.name}`" not in API
                        and f"{f.name}=" not in API]
    missing += [f"errors.{e}" for e in dir(minigpt.errors) if e.endswith("Error") and f"`{e}`" not in API
                and f"`minigpt.{e}`" not in API]
    assert not missing, f"docs/api.md does not document: {missing}"


def test_the_options_table_gives_every_declared_option_its_default_and_bounds():
    """docs/api.md's table of options against their one declaration (minigpt.requests.request.OPTIONS):
    a row for each, its default as declared, and the bounds that constants set written as they are."""
    from minigpt.loop.sampling import MAX_TOP_LOGPROBS
    from minigpt.requests.request import MAX_BIAS, MAX_PENALTY, OPTIONS, REPETITION_RANGE

    rows = {}  # keyword -> (default, bounds)
    for line in API.splitlines():
        cells = [cell.strip() for cell in re.split(r"(?:^|\s)\|(?=\s|$)", line.strip())][1:-1]  # not <|endoftext|>
        keywords = re.findall(r"`(\w+)`", cells[0]) if line.startswith("| `") and len(cells) == 4 else []
        if keywords and all(keyword in OPTIONS for keyword in keywords):
            rows.update({keyword: (cells[1], cells[3]) for keyword in keywords})
    assert sorted(rows) == sorted(OPTIONS)
    assert {name: rows[name][0] for name in OPTIONS} == {name: repr(o.default) for name, o in OPTIONS.items()}
    bounds = {"top_logprobs": f"0 .. {MAX_TOP_LOGPROBS}", "logit_bias": f"[-{MAX_BIAS}, {MAX_BIAS}]",
              "presence_penalty": f"[-{MAX_PENALTY}, {MAX_PENALTY}]", "repetition_penalty": REPETITION_RANGE}
    assert {name: text in rows[name][1] for name, text in bounds.items()} == dict.fromkeys(bounds, True)
