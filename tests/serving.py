"""A minigpt server for tests: in a thread of the test process (so a test can read its engine's
stats), on 127.0.0.1 at a port the system picks, stopped when the test is done. Tests that need the
`serve` extra or the `openai` client skip, saying which is missing."""

from __future__ import annotations

import contextlib
import http.client
import json
import threading
import time

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed (pip install -e '.[serve]')")
pytest.importorskip("uvicorn", reason="the serve extra is not installed (pip install -e '.[serve]')")

import minigpt  # noqa: E402
from minigpt.engine.engine import Engine  # noqa: E402
from minigpt.server.http_server import bind, server  # noqa: E402
from minigpt.server.serve import Service  # noqa: E402

HOST = "127.0.0.1"


# The fixtures of the modules that drive a random-tiny server through the openai client: they import
# model, served and client from here.
@pytest.fixture(scope="module")
def model(tiny_model, tokenizer):
    """conftest's random-tiny, its tokenizer built: the served prompts are text."""
    return tiny_model


@pytest.fixture(scope="module")
def served(model):
    with running_server(model, max_batch_size=8) as (service, url):
        yield service, url


@pytest.fixture(scope="module")
def client(served):
    openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install -e '.[test]')")
    return openai.OpenAI(base_url=served[1] + "/v1", api_key="unused", max_retries=0)


@contextlib.contextmanager
def running_server(model, name: str = "random-tiny", max_queue: int = 256, **engine_options):
    """(service, base URL) of a server on an ephemeral port of 127.0.0.1, until the block ends."""
    service = Service(model, Engine(model, **engine_options), name, max_queue)
    sock = bind(HOST, 0)
    uv = server(service)
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the test server did not start")
        time.sleep(0.01)
    try:
        yield service, f"http://{HOST}:{sock.getsockname()[1]}"
    finally:
        uv.should_exit = True
        thread.join(30)
        sock.close()


def post(url: str, path: str, body, raw: bytes | None = None) -> tuple[int, dict, dict]:
    """(status, headers, JSON body) of a POST to 127.0.0.1."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("POST", path, raw if raw is not None else json.dumps(body),
                           {"Content-Type": "application/json"})
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(response.read())
    finally:
        connection.close()


def get(url: str, path: str) -> tuple[int, dict]:
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def settled(service, timeout: float = 30) -> dict:
    """The engine's stats once nothing is in flight and no page is in use (or at the deadline)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        stats = service.engine.stats()
        if service.in_flight == 0 and stats["pages_in_use"] == 0 and not service.engine_thread.tickets:
            return stats
        time.sleep(0.02)
    return service.engine.stats()


def scrape(url: str) -> dict[tuple, float]:
    """/metrics as {(sample name, its labels but model_name, sorted): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    return {(s.name, *sorted((k, v) for k, v in s.labels.items() if k != "model_name")): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}
