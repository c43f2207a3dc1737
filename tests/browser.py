"""A served model's page in headless Chromium (Debian's package) driven by Playwright, for the page's
tests; a module importing this one is skipped, saying why, without playwright or Chromium."""

from __future__ import annotations

import contextlib
import shutil

import pytest

from serving import running_server

sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (pip install -e '.[browser]')")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no Chromium to drive: apt-get install chromium (.ci/run does)", allow_module_level=True)


@contextlib.contextmanager
def page_of(model):
    """(service, page, problems): the server's page, loaded, and the console's errors and warnings."""
    problems: list[str] = []
    with running_server(model) as (service, url), sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: problems.append(m.text) if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(str(e)))
            page.goto(url + "/")
            page.wait_for_function("document.querySelector('#stats dd') !== null")
            yield service, page, problems
        finally:
            browser.close()
