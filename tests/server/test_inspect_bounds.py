"""/inspect and `inspect` within bounds: /inspect computes one layer's and head's attention at that
head's cost (bitwise minigpt.inspect's), for at most INSPECT_TOKENS ids, one request at a time with at
most INSPECT_IN_FLIGHT held (then a 429); `inspect` keeps only the attention it draws or prints,
refuses to print more than MAX_PRINTED_WEIGHTS weights before the forward, and draws pictures of a
bounded size at any length."""

from __future__ import annotations

import json
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from commands import run

import minigpt
from minigpt.cli import inspect as inspect_command
from minigpt.cli import pictures
from minigpt.errors import ContextLengthError
from minigpt.api import inspection
from minigpt.api import api

IDS = [464, 3290, 4966, 284, 262, 3952, 290, 788, 13, 198, 464]


def png_size(path) -> tuple[int, int]:
    """A PNG's (width, height) in pixels, from its IHDR chunk."""
    return struct.unpack(">II", path.read_bytes()[16:24])


@pytest.mark.parametrize("layer, head", [(0, 0), (1, 3), (0, 2)])
def test_one_head_s_attention_is_bitwise_that_head_of_the_whole_inspection(tiny_model, layer, head):
    whole = minigpt.inspect(tiny_model, IDS).attention[layer, head]
    one = api.head_attention(tiny_model, IDS, layer, head)
    assert one.shape == (len(IDS), len(IDS)) and np.array_equal(one.view(np.uint32), whole.view(np.uint32))


def test_an_inspection_keeps_the_attention_of_the_layers_and_heads_asked_for_only(tiny_model):
    whole = minigpt.inspect(tiny_model, IDS)
    part = minigpt.inspect(tiny_model, IDS, layers=[1], heads=[3, 0])
    assert part.attention.shape == (1, 2, len(IDS), len(IDS)) and (part.layers, part.heads) == ([1], [3, 0])
    assert np.array_equal(part.attention.view(np.uint32), whole.attention[[1]][:, [3, 0]].view(np.uint32))
    assert np.array_equal(part.logits, whole.logits) and np.array_equal(part.hidden, whole.hidden)
    assert minigpt.inspect(tiny_model, IDS, layers=[]).attention.shape == (0, 4, len(IDS), len(IDS))


def test_one_head_s_attention_is_refused_beyond_its_length_limit(tiny_model, monkeypatch):
    monkeypatch.setattr(api, "INSPECT_TOKENS", 8)
    with pytest.raises(ContextLengthError, match="the attention of 1 to 8 token ids can be looked at, got 11"):
        api.head_attention(tiny_model, IDS, 0, 0)


def test_the_server_s_inspect_computes_one_request_at_a_time_and_answers_a_429_beyond_those_it_holds(
        tiny_model, monkeypatch):
    pytest.importorskip("starlette", reason="the serve extra is not installed (pip install -e '.[serve]')")
    from serving import post, running_server
    from minigpt.server import page
    computing, most, release = [0], [0], threading.Event()
    lock = threading.Lock()

    def slow(*args):
        with lock:
            computing[0] += 1
            most[0] = max(most[0], computing[0])
        release.wait(30)
        with lock:
            computing[0] -= 1
        return api.head_attention(*args)

    monkeypatch.setattr(page, "head_attention", slow)
    body = {"tokens": IDS, "layer": 1, "head": 2}
    with running_server(tiny_model) as (_, url), ThreadPoolExecutor(8) as pool:
        held = [pool.submit(post, url, "/inspect", body) for _ in range(page.INSPECT_IN_FLIGHT)]
        time.sleep(0.5)  # every one of them is held
        refused = [post(url, "/inspect", body) for _ in range(2)]
        release.set()
        answers = [f.result() for f in held]
    assert [status for status, _, _ in refused] == [429, 429]
    assert refused[0][2]["error"]["type"] == "rate_limit_error" and "/inspect" in refused[0][2]["error"]["message"]
    assert all(status == 200 for status, _, _ in answers) and most[0] == 1
    assert answers[0][2]["attention"] == minigpt.inspect(tiny_model, IDS).attention[1, 2].tolist()


def test_the_server_s_inspect_refuses_more_ids_than_its_limit_with_a_400(tiny_model, monkeypatch):
    pytest.importorskip("starlette", reason="the serve extra is not installed (pip install -e '.[serve]')")
    from serving import post, running_server
    monkeypatch.setattr(api, "INSPECT_TOKENS", 8)
    with running_server(tiny_model) as (_, url):
        status, _, body = post(url, "/inspect", {"tokens": IDS, "layer": 0, "head": 0})
    assert status == 400 and body["error"]["param"] == "tokens" and "1 to 8 token ids" in body["error"]["message"]


def test_inspect_json_attention_beyond_its_bound_is_refused_before_the_forward(capsys, monkeypatch):
    monkeypatch.setattr(inspect_command, "MAX_PRINTED_WEIGHTS", 100)
    monkeypatch.setattr(inspection, "inspect", lambda *a, **k: pytest.fail("the forward ran"))
    code, out, err = run(capsys, "inspect", "The dog ran to the park", "--model", "random-tiny", "--json", "--attention")
    assert code == 2 and out == "" and "2 layers x 4 heads x 6^2 positions are 288 weights, beyond the 100" in err
    assert "--layer" in err and err.count("\n") == 1


def test_inspect_json_attention_of_one_layer_and_head_prints_that_head_only(tiny_model, tokenizer, capsys):
    code, out, _ = run(capsys, "inspect", "The dog ran", "--model", "random-tiny", "--json", "--attention",
                       "--layer", "1", "--head", "2")
    document = json.loads(out)
    whole = minigpt.inspect(tiny_model, document["ids"]).attention
    assert code == 0 and (document["attention_layers"], document["attention_heads"]) == ([1], [2])
    assert document["attention"] == whole[[1]][:, [2]].tolist()


def test_inspect_refuses_a_text_longer_than_its_limit_before_the_forward(capsys, monkeypatch):
    monkeypatch.setattr(inspect_command, "INSPECT_TOKENS", 4)
    monkeypatch.setattr(inspection, "inspect", lambda *a, **k: pytest.fail("the forward ran"))
    code, _, err = run(capsys, "inspect", "The dog ran to the park", "--model", "random-tiny")
    assert code == 2 and "6 tokens; inspect looks inside at most 4" in err


def test_pictures_of_a_long_text_stay_within_their_size(capsys, tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
    text = " ".join(["word"] * 250)
    code, _, _ = run(capsys, "inspect", text, "--model", "random-tiny", "--layer", "0", "--head", "0",
                     "--plot", str(tmp_path))
    assert code == 0
    limit = pictures.MAX_INCHES * 100
    for name in ("attention-layer0-head0.png", "logit-lens.png"):
        width, height = png_size(tmp_path / name)
        assert 0 < width <= limit and 0 < height <= limit, (name, width, height)
