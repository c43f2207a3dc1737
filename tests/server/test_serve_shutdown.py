"""SIGTERM while requests are still being prepared (a constraint compiling, an /inspect forward
running), on a real server process: each is answered the documented 503 in OpenAI's shape after
the grace period, and the process exits promptly (0), with no traceback in its log."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from serving import HOST

from minigpt.server import serve

pytest.importorskip("llguidance", reason="the structured extra (llguidance) is not installed")

# Loaded by the server process alone (sitecustomize, first on its PYTHONPATH): compiling a
# constraint and /inspect's forward take a minute, however fast the machine.
SLOW = """
import time
import minigpt.requests.request
import minigpt.server.page

def slowly(work):
    def slow(*args, **kwargs):
        time.sleep(60)
        return work(*args, **kwargs)
    return slow

minigpt.requests.request.compile_constraint = slowly(minigpt.requests.request.compile_constraint)
minigpt.server.page.inspected = slowly(minigpt.server.page.inspected)
"""


def ask(port: int, path: str, body: dict) -> tuple[int, dict]:
    connection = http.client.HTTPConnection(HOST, port, timeout=120)
    connection.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, json.loads(response.read())


def test_sigterm_during_preparation_answers_503_and_exits_promptly(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(SLOW)
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    process = subprocess.Popen([sys.executable, "-m", "minigpt", "serve", "--port", "0", "--model", "random-tiny"],
                               stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": path})
    try:
        line = process.stderr.readline()
        assert " listening on http://" in line, line
        port = int(line.split(" on ")[1].split()[0].rsplit(":", 1)[1])
        with ThreadPoolExecutor(3) as pool:
            asked = [pool.submit(ask, port, "/v1/completions", {"prompt": "a", "max_tokens": 2, "guided_regex": "[0-9]+"}),
                     pool.submit(ask, port, "/v1/completions", {"prompt": "b", "max_tokens": 2, "stream": True,
                                                                "guided_choice": ["x", "y"]}),
                     pool.submit(ask, port, "/inspect", {"tokens": [464, 3290], "layer": 0, "head": 0})]
            time.sleep(2)  # every request is being prepared (for a minute)
            assert not any(f.done() for f in asked)
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            answers = [f.result(timeout=60) for f in asked]
            answered = time.monotonic() - signalled
        assert process.wait(timeout=30) == 0
        exited = time.monotonic() - signalled
        for status, answer in answers:
            assert status == 503 and answer["error"]["code"] == "shutting_down", answer
            assert answer["error"]["type"] == "server_error" and "shutting down" in answer["error"]["message"]
        assert serve.SHUTDOWN_GRACE_SECONDS <= answered and exited < 40  # not when the minute-long preparations end
        log = process.stderr.read()
        assert "Traceback" not in log and "CancelledError" not in log and "500" not in log, log
    finally:
        process.kill()
        process.wait()
