"""The server's page in a real browser: headless Chromium (Debian's package) driven by Playwright types
a prompt and generates greedily; the page's tokens, text and log-probabilities are generate's, a
token's alternatives appear on hover, its attention on click, the engine panel moves, and the
console stays clean."""

from __future__ import annotations

from browser import page_of
from serving import model  # noqa: F401 (a fixture)

import minigpt

PROMPT = "The dog ran to the"


def test_the_page_streams_generate_s_tokens_shows_alternatives_attention_and_the_engine(model, tmp_path):  # noqa: F811
    alone = minigpt.generate(model, minigpt.encode(model.tokenizer, PROMPT), 8)
    with page_of(model) as (service, page, problems):
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
    assert problems == []
