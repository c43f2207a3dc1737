"""Every example in README.md and docs/*.md runs, offline, as written.

Each ```python block runs in a subprocess (after PRELUDE, which defines the names fragments use
for a loaded model); each command of a ```sh, ```bash or ```console block that starts with
`python` runs as a subprocess with a timeout. They run in a temporary directory holding `docs/img`
(for `--plot` paths), where a ```json block that the text introduces with "With `NAME`:" is first
written to NAME, as the README's `batch` example needs; a command in the prose, in backticks,
that reads such a file runs too. A model from the Hugging Face Hub (`gpt2`,
`gpt2-medium`, ..., `distilgpt2`, `openai-community/...`) is swapped for `random-tiny`, and so is
`staircase`'s default model (the examples show behaviour, not speed); `random-124m`, which needs no
download, stays where shapes matter and is swapped only in the examples listed in SMALLER. So
nothing touches the network and the whole file runs in about a minute. Commands that need the network, run the
test suite itself or measure for minutes are listed in SKIP with their reason, printed when
skipped; so is a command synopsis (`[--option]`). The examples that call a server (curl, the openai
client, at 127.0.0.1:8000) run against one this file starts as the README does, on a free port.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
RUN_LANGS = {"python", "sh", "bash", "console"}
HUB = re.compile(r"""(?<![\w./-])(?:openai-community/)?(?:gpt2-medium|gpt2-large|gpt2-xl|distilgpt2|gpt2)(?![\w.-])""")
TIMEOUT = 120
PRELUDE = """\
import minigpt
model = minigpt.load("random-tiny")
ids = minigpt.encode(model.tokenizer, "The dog")
gpt2_xl = model  # the name speculative.md gives its big model
"""

# (file, text of the example): random-124m swapped for random-tiny there, to keep the run short
SMALLER = [
    ("docs/batching.md", 'minigpt.load("random-124m", kernels="fast")'),  # 8 prompts x 64 tokens, twice
]

# (command prefix, reason): commands shown but not run here
SKIP = [
    ("pip ", "installs from the package index: needs the network"),
    ("python3 -m venv", "creates a virtual environment and installs into it: needs the network"),
    ("hf ", "downloads from the Hugging Face Hub: needs the network"),
    ("python -m pytest", "the test suite itself"),
    ("python scripts/benchmark.py", "the benchmark: minutes per section"),
    ("python scripts/mutants.py", "runs the guarding tests of every bug it lists, each in a copy of the code: a minute or more"),
    ("python -m minigpt tune", "measures this machine and keeps its choice in the user's cache directory"),
    ("python -m minigpt staircase --prompt-tokens 128 --new-tokens 128", "a 128 + 128 staircase: over a minute"),
    ("python -m minigpt staircase --prompt-tokens 512", "a 512-token staircase: over a minute"),
    ("CI=1 python -m pytest", "the test suite itself"),
    ("python -m minigpt serve", "a server runs until it is stopped: the examples that call one run against a "
                                "server this test starts on a free port"),
]
SERVED = "127.0.0.1:8000"  # where the examples' server listens; theirs is started on a free port instead


def examples() -> list[tuple[str, int, str, str, list[tuple[str, str]]]]:
    """(file, line, language, code, json files to write first) for every runnable block."""
    found = []
    for path in FILES:
        text, files = path.read_text(), []
        for m in FENCE.finditer(text):
            lang, code = m.group(1), m.group(2)
            line = text.count("\n", 0, m.start()) + 1
            if lang == "json":
                named = re.search(r"With `([\w.-]+\.jsonl?)`:\s*$", text[:m.start()])
                if named:
                    files.append((named.group(1), code))
            elif lang in RUN_LANGS:
                found.append((path.relative_to(ROOT).as_posix(), line, lang, code, list(files)))
        for name, _ in files:  # a command in the prose that reads such a file: `python -m minigpt batch NAME ...`
            for m in re.finditer(rf"`(python -m minigpt [^`]*\b{re.escape(name)}\b[^`]*)`", text):
                found.append((path.relative_to(ROOT).as_posix(), text.count("\n", 0, m.start()) + 1, "sh",
                              m.group(1), list(files)))
    return found


def commands(code: str) -> list[str]:
    """The commands of a shell block: continued lines joined, comments dropped, `&&` chains split."""
    joined = re.sub(r"\\\n\s*|\n\s+(?=\[)", " ", code)  # a continued line; a synopsis's indented options
    out = []
    for line in joined.splitlines():
        line = line.strip().removeprefix("$ ")
        if not line or line.startswith("#"):
            continue
        out.extend(c.strip() for c in re.split(r"\s&&\s", line) if c.strip())
    return out


def offline(text: str) -> str:
    return HUB.sub("random-tiny", text)


STRUCTURED = re.compile(r"--(?:choice|regex|json-schema|grammar)\b|\b(?:choice|regex|json_schema|grammar)\b\"?\s*[=:]")
NO_LLGUIDANCE = "constrains the text: the structured extra (llguidance) is not installed"


def needs_missing_llguidance(text: str) -> bool:
    """Whether an example constrains its output (a flag, keyword or JSON field) while llguidance is absent."""
    return bool(STRUCTURED.search(text)) and importlib.util.find_spec("llguidance") is None


def skip_reason(command: str) -> str | None:
    bare = re.sub(r"^(?:\w+=\S*\s+)+", "", command)  # PYTHONPATH=. python ... -> python ...
    if needs_missing_llguidance(bare):
        return NO_LLGUIDANCE
    if bare.startswith("curl ") and "http://127.0.0.1:" in bare:
        return None  # a request to the examples' server
    if not bare.startswith("python"):
        return f"not a python command: {bare.split()[0]!r}"
    if re.search(r"\s\[-", bare):
        return "a synopsis of the options, not a command"
    for prefix, reason in SKIP:
        if bare.startswith(prefix) or command.startswith(prefix):
            return reason
    if " --plot" in bare and importlib.util.find_spec("matplotlib") is None:
        return "draws a plot: the plot extra (matplotlib) is not installed"
    return None


def run(argv: list[str], cwd: Path, what: str, stdin: str | None = None) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT, input=stdin)
    assert done.returncode == 0, f"{what} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


def setup(tmp_path: Path, files: list[tuple[str, str]]) -> None:
    (tmp_path / "docs" / "img").mkdir(parents=True)
    for name, content in files:
        (tmp_path / name).write_text(content)


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """`python -m minigpt serve --model random-tiny` on a free port of 127.0.0.1, as the README starts
    it, for the examples that call a server: its host:port, once /health answers."""
    pytest.importorskip("uvicorn", reason="the serve extra (starlette, uvicorn) runs the server examples")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    process = subprocess.Popen([sys.executable, "-m", "minigpt", "serve", "--model", "random-tiny", "--port",
                                str(port)], env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):  # at most a minute
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                assert process.poll() is None, "the examples' server exited"
                time.sleep(0.1)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(timeout=30)


EXAMPLES = examples()


@pytest.mark.parametrize("file,line,lang,code,files", EXAMPLES, ids=[f"{e[0]}:{e[1]}" for e in EXAMPLES])
def test_example_runs(file, line, lang, code, files, tmp_path, capsys, request):
    setup(tmp_path, files)
    if SERVED in code:
        code = code.replace(SERVED, request.getfixturevalue("server"))
    if lang == "python":
        if needs_missing_llguidance(code):
            pytest.skip(f"{file}:{line}: {NO_LLGUIDANCE}")
        source = offline(code)
        if any(file == f and text in code for f, text in SMALLER):
            source = source.replace('"random-124m"', '"random-tiny"')
        uses_model = re.search(r"\b(model|ids|gpt2_xl)\b", source) and not re.search(r"^model\s*=", source, re.M)
        run([sys.executable, "-c", (PRELUDE if uses_model else "") + source], tmp_path, f"{file}:{line}")
        return
    ran = 0
    for command in commands(code):
        reason = skip_reason(command)
        if reason:
            with capsys.disabled():
                print(f"\n{file}:{line}: not run: {command[:70]!r}: {reason}")
            continue
        if " minigpt staircase" in command and "--model" not in command:
            command += " --model random-tiny"  # its default is random-124m: a minute of timing on two cores
        argv = shlex.split(offline(command), comments=True)
        while argv and re.match(r"^\w+=", argv[0]):
            argv.pop(0)  # PYTHONPATH=. and the like: the subprocess gets the checkout on its path anyway
        run(argv if argv[0] == "curl" else [sys.executable, *argv[1:]], tmp_path, f"{file}:{line}: {command}")
        ran += 1
    if not ran:
        pytest.skip(f"{file}:{line}: every command of this block is listed as not run (reasons printed above)")


def test_the_extraction_finds_the_examples():
    """The runner sees the README's Python example and its batch input, and swaps hub names."""
    readme = [e for e in EXAMPLES if e[0] == "README.md"]
    assert any(lang == "python" and "minigpt.load(" in code for _, _, lang, code, _ in readme)
    assert any(code.startswith("python -m minigpt batch prompts.jsonl") and files[0][0] == "prompts.jsonl"
               for _, _, _, code, files in readme)
    assert offline('minigpt.load("gpt2") --model openai-community/gpt2-xl gpt2-bpe') == \
        'minigpt.load("random-tiny") --model random-tiny gpt2-bpe'
    assert commands("a \\\n  b && c  # note\n# comment\n") == ["a  b", "c  # note"]
    assert commands("python -m minigpt x [--a A]\n      [--b B]\n") == ["python -m minigpt x [--a A] [--b B]"]
    assert skip_reason("pip install .") and skip_reason('python -m minigpt generate "P" [--model SRC]')
    assert skip_reason("PYTHONPATH=. python -m minigpt cost --prompt 512 --reply 256") is None
