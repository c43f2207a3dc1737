"""The page in a real browser (headless Chromium driven by Playwright) with the prompts and keys a
hostile user tries: a prompt with an emoji and right-to-left marks shows exactly as typed (its spans
come from the text, not from token strings, so no replacement character); an empty prompt is served
as the API serves "" (from <|endoftext|>), its tokens' attention included; and Ctrl+Enter while a
generation runs starts no second one (the tokens shown are one generation's, as many as the status says)."""

from __future__ import annotations

import pytest

from browser import page_of
from serving import model  # noqa: F401 (a fixture)

import minigpt

DONE = "document.getElementById('status').textContent.startsWith('done')"


def generated(page) -> list[tuple[int, str]]:
    return [(int(i), text) for i, text in page.eval_on_selector_all(
        "#output span.token.generated", "spans => spans.map(s => [s.dataset.tokenId, s.textContent])")]


def generate_greedily(page, prompt: str, tokens: int) -> None:
    page.fill("#prompt", prompt)
    page.fill("#max-tokens", str(tokens))
    page.fill("#temperature", "0")
    page.click("#generate")


@pytest.mark.parametrize("prompt", ["Hi \U0001F600\u200f! \u05e9\u05dc\u05d5\u05dd \u200e(ok)", "\u200f", "a\u0301 \U0001F469\u200d\U0001F52C"])
def test_a_prompt_with_emoji_and_right_to_left_marks_shows_exactly_as_typed(model, prompt):  # noqa: F811
    alone = minigpt.generate(model, minigpt.encode(model.tokenizer, prompt), 6)
    with page_of(model) as (_, page, problems):
        generate_greedily(page, prompt, 6)
        page.wait_for_function(DONE, timeout=60_000)
        shown = page.eval_on_selector_all("#output span.token.prompt", "spans => spans.map(s => s.textContent)")
        ids = page.eval_on_selector_all("#output span.token.prompt", "spans => spans.map(s => Number(s.dataset.tokenId))")
        made = generated(page)
    assert "".join(shown) == prompt and "\ufffd" not in "".join(shown)
    assert ids == minigpt.encode(model.tokenizer, prompt)
    assert [i for i, _ in made] == alone.tokens and problems == []


def test_an_empty_prompt_is_served_as_the_api_serves_it_and_its_attention_shows(model):  # noqa: F811
    alone = minigpt.generate(model, [], 6, temperature=1.0, seed=3)  # from <|endoftext|>, as the API serves ""
    with page_of(model) as (_, page, problems):
        page.fill("#prompt", "")
        page.fill("#max-tokens", "6")
        page.fill("#temperature", "1")
        page.fill("#seed", "3")
        page.click("#generate")
        page.wait_for_function(DONE, timeout=60_000)
        status = page.text_content("#status")
        made = generated(page)
        assert page.locator("#output span.token.prompt").count() == 0
        page.click("#output span.token.generated >> nth=1")
        page.wait_for_function("document.getElementById('status').textContent.startsWith('attention')")
        shaded = page.eval_on_selector_all("#output span.token", "spans => spans.map(s => s.style.boxShadow !== '')")
    assert status == "done: 6 tokens (length)"
    assert [i for i, _ in made] == alone.tokens and "".join(t for _, t in made) == alone.text
    assert shaded == [True, True] + [False] * (len(made) - 2) and problems == []


def test_ctrl_enter_during_a_generation_starts_no_second_one(model):  # noqa: F811
    prompt = "The dog ran to the"
    alone = minigpt.generate(model, minigpt.encode(model.tokenizer, prompt), 60, stop_at_eos=False)
    with page_of(model) as (_, page, problems):
        page.fill("#prompt", prompt)
        page.fill("#max-tokens", "60")
        page.fill("#temperature", "0")
        page.click("#generate")
        page.focus("#prompt")
        for _ in range(3):  # while the first streams
            page.keyboard.press("Control+Enter")
        page.wait_for_function(DONE, timeout=60_000)
        page.wait_for_timeout(500)  # a second generation, had one started, would still be streaming
        status = page.text_content("#status")
        made = generated(page)
    count = int(status.split()[1])
    assert len(made) == count and [i for i, _ in made] == alone.tokens[:count] and problems == []
