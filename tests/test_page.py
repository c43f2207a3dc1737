"""The server's page in a real browser: headless Chromium (Debian's package) driven by Playwright types
a prompt and generates greedily; the page's tokens, text and log-probabilities are generate's, a
token's alternatives appear on hover, its attention on click, the engine panel moves, and the
console stays clean."""

from __future__ import annotations

import shutil

import pytest

from serving import running_server

import minigpt

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[browser]')")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no Chromium to drive: apt-get install chromium (.ci/run does)", allow_module_level=True)

PROMPT = "The dog ran to the"


@pytest.fixture(scope="module")
def model():
    return minigpt.load("random-tiny")


def test_the_page_streams_generate_s_tokens_shows_alternatives_attention_and_the_engine(model, tmp_path):
    alone = minigpt.generate(model, minigpt.encode(model.tokenizer, PROMPT), 8)
    problems: list[str] = []
    with running_server(model) as (service, url), sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(url + "/")
            page.wait_for_function("document.querySelector('#stats dd') !== null")
            page.fill("#prompt", PROMPT)
            page.fill("#max-tokens", "8")
            page.fill("#temperature", "0")
            page.click("#generate")
            page.wait_for_function("document.getElementById('status').textContent.startsWith('done')", timeout=60_000)

            generated = page.eval_on_selector_all(
                "#output span.token.generated", "spans => spans.map(s => [s.dataset.tokenId, s.textContent, s.dataset.logprob])")
            assert [int(i) for i, _, _ in generated] == alone.tokens
            assert [float(lp) for _, _, lp in generated] == alone.logprobs  # bitwise: shortest round-trip reprs
            assert "".join(t for _, t, _ in generated) == alone.text
            prompt = page.eval_on_selector_all("#output span.token.prompt", "spans => spans.map(s => s.textContent)")
            assert "".join(prompt) == PROMPT

            page.hover("#output span.token.generated >> nth=0")
            page.wait_for_selector("#alternatives table")
            assert page.locator("#alternatives tr").count() == 5

            page.focus("#output span.token.generated >> nth=2")
            page.keyboard.press("Enter")  # keyboard alone: its attention
            page.wait_for_function("document.getElementById('status').textContent.startsWith('attention')")
            shaded = page.eval_on_selector_all("#output span.token", "spans => spans.map(s => s.style.boxShadow !== '')")
            position = len(prompt) + 2
            assert shaded == [i <= position for i in range(len(shaded))]

            page.wait_for_function(  # the engine panel follows /metrics: the 8 tokens are counted
                "[...document.querySelectorAll('#stats dt')].some(dt => dt.textContent === 'tokens generated' "
                "&& Number(dt.nextElementSibling.textContent) >= 8)", timeout=10_000)
            panel = dict(zip(page.eval_on_selector_all("#stats dt", "dts => dts.map(d => d.textContent)"),
                             page.eval_on_selector_all("#stats dd", "dds => dds.map(d => Number(d.textContent))")))
            pages = service.engine.stats()
            assert panel["KV pages free"] + panel["KV pages cached"] + panel["KV pages in use"] == pages["pages_total"]
            shot = tmp_path / "page.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        finally:
            browser.close()
    assert problems == []
