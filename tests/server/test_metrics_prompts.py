"""/metrics counts every prompt token the server computes: a choice's prompt is counted once it is
prefilled, whether or not it then makes a token (an echo request with max_tokens 0 scores its
prompt and makes none), and never twice."""

from __future__ import annotations

import http.client

import pytest

pytest.importorskip("prometheus_client", reason="the serve extra is not installed (pip install -e '.[serve]')")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from serving import model, post, running_server  # noqa: E402,F401 (model: a fixture)


def counters(url: str) -> dict[str, float]:
    """/metrics' counters: name -> value."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    connection.request("GET", "/metrics")
    text = connection.getresponse().read().decode()
    connection.close()
    return {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.endswith("_total")}


@pytest.mark.parametrize("body, prompt_tokens, scored, generated", [
    ({"prompt": [1, 2, 3, 4, 5], "max_tokens": 0, "echo": True, "logprobs": 1}, 5, 5, 0),  # scores its prompt only
    ({"prompt": [1, 2, 3], "max_tokens": 2, "ignore_eos": True}, 3, 3, 2),
    ({"prompt": [[1, 2], [3, 4, 5, 6]], "max_tokens": 0, "echo": True, "logprobs": 0}, 6, 6, 0),
    ({"prompt": [1, 2, 3], "max_tokens": 0, "echo": True}, 3, 0, 0),  # no logprobs: the text, nothing computed
])
def test_every_scored_prompt_token_is_counted_once(model, body, prompt_tokens, scored, generated):  # noqa: F811
    with running_server(model) as (_, url):
        before = counters(url)
        status, _, answer = post(url, "/v1/completions", body)
        after = counters(url)
    assert status == 200 and answer["usage"]["prompt_tokens"] == prompt_tokens
    assert after["minigpt:prompt_tokens_total"] - before["minigpt:prompt_tokens_total"] == scored
    assert after["minigpt:generation_tokens_total"] - before["minigpt:generation_tokens_total"] == generated
