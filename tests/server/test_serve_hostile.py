"""The server against hostile clients and a stop under load: every request completes or gets an
error in OpenAI's shape that says why, streams end with an error event and [DONE], the event loop
stays free for other clients whatever one sends, and the command refuses what can never work at
start-up, naming the option."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from serving import HOST, get, post, running_server, settled
from checkpoints import with_huge_position

import minigpt
from minigpt.engine import engine as engine_module
from minigpt.server import completion_request, http_server, serve


@pytest.fixture(scope="module")
def served(tiny_model, tokenizer):
    with running_server(tiny_model, max_batch_size=4, max_queue=4) as (service, url):
        yield service, url


def start_cli(*options: str, env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`python -m minigpt serve` in a subprocess on an ephemeral port; (process, URL) once it listens."""
    process = subprocess.Popen([sys.executable, "-m", "minigpt", "serve", "--port", "0", *options],
                               stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})
    line = process.stderr.readline()
    assert " listening on http://" in line, line
    return process, line.split(" on ")[1].split()[0]


def open_request(port: int, body: dict) -> http.client.HTTPResponse:
    connection = http.client.HTTPConnection(HOST, port, timeout=60)
    connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    return connection.getresponse()


def test_sigterm_under_load_answers_every_request_ends_every_stream_and_exits_promptly():
    """24 long requests in flight (12 whole, 12 streamed): after SIGTERM each whole one is answered
    (200, or a 503 in OpenAI's shape), each stream ends with [DONE] (an error event before it if it
    was cut), the server exits 0 within a few seconds of its grace period, with no traceback."""
    process, url = start_cli("--model", "random-124m", "--max-batch-size", "24")
    port = int(url.rsplit(":", 1)[1])
    body = {"prompt": [464, 3290], "max_tokens": 500, "ignore_eos": True, "temperature": 0}
    try:
        with ThreadPoolExecutor(24) as pool:
            whole = [pool.submit(lambda: (r := open_request(port, body)).status and (r.status, r.read()))
                     for _ in range(12)]
            streams = [open_request(port, {**body, "stream": True}) for _ in range(12)]
            first = [s.readline() for s in streams]  # each stream has begun: the engine is running them all
            assert all(line.startswith(b"data: ") for line in first)
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            tails = [first[i] + s.read() for i, s in enumerate(streams)]
            answers = [f.result(timeout=60) for f in whole]
        assert process.wait(timeout=30) == 0
        assert time.monotonic() - signalled < serve.SHUTDOWN_GRACE_SECONDS + 5
        for status, raw in answers:
            answer = json.loads(raw)
            assert status == 200 and answer["choices"][0]["finish_reason"] == "length" or status == 503 and \
                answer["error"]["type"] == "server_error" and "shutting down" in answer["error"]["message"]
        assert any(status == 503 for status, _ in answers)
        for tail in tails:
            events = [line for line in tail.decode().splitlines() if line.startswith("data: ")]
            assert events[-1] == "data: [DONE]"
            last = json.loads(events[-2][6:])
            assert "error" in last and "shutting down" in last["error"]["message"] or \
                last["choices"][0]["finish_reason"] == "length"
        log = process.stderr.read()
        assert "Traceback" not in log and "CancelledError" not in log, log
    finally:
        process.kill()
        process.wait()


def test_health_answers_while_a_huge_prompt_is_being_encoded(served, monkeypatch):
    """A 7 MB text prompt, whose encoding is made to take 3 s here (how long depends on the machine):
    /health answers before it is done, since bodies are checked and encoded in a worker thread."""
    encode = completion_request.encode_text

    def slowly(model, text):
        time.sleep(3)
        return encode(model, text)
    monkeypatch.setattr(completion_request, "encode_text", slowly)
    answered = []
    big = threading.Thread(target=lambda: answered.append(
        post(served[1], "/v1/completions", {"prompt": "hello world " * 600_000, "max_tokens": 1})))
    big.start()
    time.sleep(0.5)  # its body has arrived and is being encoded
    assert get(served[1], "/health") == (200, {"status": "ok"})
    assert not answered, "the huge prompt was answered before /health"
    big.join(120)
    status, _, answer = answered[0]
    assert status == 400 and answer["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize("body, param, message", [
    ({"stop": ["."] * (completion_request.MAX_STOP_STRINGS + 1)}, "stop", "at most"),
    ({"stop": "x" * (completion_request.MAX_STOP_CHARS + 1)}, "stop", "at most"),
    ({"stop": False}, "stop", "a string or a list of strings"),
    ({"stop": 0}, "stop", "a string or a list of strings"),
    ({"stop": {}}, "stop", "a string or a list of strings"),
    ({"logit_bias": 0}, "logit_bias", "must be a dict of token ids to biases"),
    ({"logit_bias": []}, "logit_bias", "must be a dict of token ids to biases"),
    ({"logit_bias": False}, "logit_bias", "must be a dict of token ids to biases"),
    ({"best_of": True}, "best_of", "must be an integer"),
    ({"presence_penalty": False}, "presence_penalty", "must be a number in [-2, 2]"),
    ({"prompt": ["x"] * 1_000_000}, "n", "at most 8 in flight"),
    ({"n": 3, "prompt": ["a", "b", "c"]}, "n", "at most 8 in flight"),
], ids=["too-many-stops", "long-stop", "stop-false", "stop-0", "stop-object", "bias-0", "bias-list", "bias-false",
        "best-of-true", "penalty-false", "a-million-prompts", "more-choices-than-ever-fit"])
def test_fields_of_the_wrong_type_or_beyond_bounds_are_a_400_naming_the_field(served, body, param, message):
    status, _, answer = post(served[1], "/v1/completions", {"prompt": "x", "max_tokens": 1, **body})
    assert status == 400 and answer["error"]["param"] == param and message in answer["error"]["message"], answer


@pytest.mark.parametrize("raw, message", [
    (b'{"prompt": "x", "model": "\\ud800"}', "lone surrogate"),
    (b'{"prompt": "x", "\\udfff": 1}', "lone surrogate"),
    (b'{"prompt": "x", "max_tokens": 1, "max_tokens": 2}', "appears twice"),
    ('{"prompt": "x"}'.encode("utf-16"), "not UTF-8"),
], ids=["surrogate-value", "surrogate-key", "duplicate-key", "utf-16"])
def test_bodies_that_are_not_one_utf8_json_object_of_unicode_text_are_a_400(served, raw, message):
    status, _, answer = post(served[1], "/v1/completions", None, raw=raw)
    assert status == 400 and message in answer["error"]["message"], answer
    assert get(served[1], "/health")[0] == 200


def test_best_of_equal_to_n_is_accepted_when_n_is_null(served):
    status, _, answer = post(served[1], "/v1/completions", {"prompt": "x", "max_tokens": 1, "best_of": 1, "n": None})
    assert status == 200 and len(answer["choices"]) == 1


def test_echo_offsets_index_the_text_even_where_a_token_splits_a_character(served, tiny_model):
    status, _, answer = post(served[1], "/v1/completions", {"prompt": "a\U0001F600b", "max_tokens": 2, "echo": True,
                                                             "logprobs": 0, "temperature": 0})
    choice = answer["choices"][0]
    offsets, text = choice["logprobs"]["text_offset"], choice["text"]
    assert offsets[:4] == [0, 1, 1, 2] and text.startswith("a\U0001F600b")  # the emoji is two tokens here
    assert offsets == sorted(offsets) and offsets[-1] < len(text)


def test_echo_of_an_empty_prompt_gives_back_nothing_before_the_completion(served, tiny_model):
    status, _, answer = post(served[1], "/v1/completions", {"prompt": "", "max_tokens": 3, "echo": True,
                                                             "logprobs": 0, "temperature": 0, "ignore_eos": True})
    alone = minigpt.generate(tiny_model, [], 3, stop_at_eos=False)
    choice = answer["choices"][0]
    assert choice["text"] == alone.text and choice["logprobs"]["token_logprobs"] == alone.logprobs


def test_a_fault_during_a_stream_is_an_error_event_of_type_server_error_then_done(served, monkeypatch):
    forward = engine_module.forward_batch

    def failing(gpt, feeds, caches, keep):
        if any(7777 in list(f) for f in feeds):
            raise RuntimeError("injected fault")
        return forward(gpt, feeds, caches, keep)
    monkeypatch.setattr(engine_module, "forward_batch", failing)
    response = open_request(int(served[1].rsplit(":", 1)[1]), {"prompt": [7777, 1], "max_tokens": 3, "stream": True})
    events = [line for line in response.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:])["error"]["type"] == "server_error"
    assert settled(served[0])["pages_in_use"] == 0


def test_idle_and_half_sent_connections_are_closed_after_the_header_deadline(tiny_model, monkeypatch):
    monkeypatch.setattr(http_server, "HEADER_SECONDS", 0.5)
    with running_server(tiny_model) as (_, url):
        port = int(url.rsplit(":", 1)[1])
        for sent in (b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"):
            with socket.create_connection((HOST, port), timeout=10) as sock:
                sock.sendall(sent)
                assert sock.recv(1024) == b""  # closed by the server, long before the 10 s timeout


def test_serve_refuses_what_can_never_work_at_start_naming_the_option(tmp_path):
    def run(*options, env=None):
        return subprocess.run([sys.executable, "-m", "minigpt", "serve", "--model", "random-tiny", "--port", "0",
                               *options], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})
    empty = run("--host", "")
    assert empty.returncode == 2 and empty.stderr.startswith("error: argument --host")
    huge = run("--max-batch-size", str(10**30))
    assert huge.returncode == 2 and "--max-batch-size" in huge.stderr and "max_batch_size" not in huge.stderr
    tables = tmp_path / "bpe"
    tables.mkdir()
    packaged = os.path.join(os.path.dirname(minigpt.__file__), "gpt2_bpe")
    whole = open(os.path.join(packaged, "encoder.json"), "rb").read()
    (tables / "encoder.json").write_bytes(whole[:len(whole) // 2])
    (tables / "vocab.bpe").write_bytes(open(os.path.join(packaged, "vocab.bpe"), "rb").read())
    broken = run(env={"MINIGPT_BPE_DIR": str(tables)})
    assert broken.returncode == 1 and "encoder.json" in broken.stderr and len(broken.stderr.splitlines()) == 1


def test_an_ipv6_literal_is_bound_as_ipv6_and_written_in_brackets(monkeypatch):
    """--host ::1 binds an IPv6 socket, and the address it says it listens on is a URL ([::1]). The
    socket is not opened: the tests listen on 127.0.0.1 only."""
    from minigpt.server import http_server

    if not socket.has_ipv6:
        pytest.skip("this Python is built without IPv6")
    bound = []
    monkeypatch.setattr(socket, "create_server", lambda address, family: bound.append((address, family)))
    http_server.bind("::1", 0)
    assert bound == [(("::1", 0), socket.AF_INET6)]
    assert http_server.url("::1", 8000) == "http://[::1]:8000"
    assert http_server.url("127.0.0.1", 8000) == "http://127.0.0.1:8000"


def test_an_overflowing_choice_is_a_500_naming_it_and_its_first_layer_and_the_server_goes_on(tiny_model, tokenizer):
    """Weights that overflow at position 8 only: the request whose prompt reaches it gets a 500 naming
    its choice and block 0; a request that stays short of it, before and after, is answered."""
    broken = with_huge_position(tiny_model, 8)
    with running_server(broken) as (service, url):
        assert post(url, "/v1/completions", {"prompt": [1, 2], "max_tokens": 3})[0] == 200
        status, _, body = post(url, "/v1/completions", {"prompt": list(range(9)), "max_tokens": 3})
        assert status == 500 and body["error"]["type"] == "server_error"
        assert body["error"]["message"].startswith("choice 0: ") and "after block 0 (h.0)" in body["error"]["message"]
        assert post(url, "/v1/completions", {"prompt": [1, 2], "max_tokens": 3})[0] == 200
