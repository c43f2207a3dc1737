"""A bounded load test: 32 concurrent clients send 240 requests (streamed or not, greedy or seeded
sampling, n of 1 or 2, with and without logprobs, sharing prefixes), a tenth of them leaving early,
to a server on a page pool tight enough to evict and preempt. Every answer that came back is
bitwise minigpt.generate's for that prompt alone, and afterwards no page is in use."""

from __future__ import annotations

import http.client
import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from serving import HOST, running_server, settled

import minigpt

N_REQUESTS, CLIENTS = 240, 32
PREFIXES = [[], list(range(300, 320)), list(range(500, 540))]  # shared beginnings (0, 1 and 2 pages)


def body_of(i: int) -> dict:
    """Request i, drawn from default_rng(i)."""
    rng = np.random.default_rng(i)
    prompt = PREFIXES[i % 3] + rng.integers(0, 50257, int(rng.integers(1, 21))).tolist()
    body = {"prompt": prompt, "max_tokens": int(rng.integers(1, 11)), "stream": bool(rng.random() < 0.4)}
    if rng.random() < 0.5:
        body["temperature"] = 0
    else:
        body.update(temperature=0.8, seed=i, n=int(rng.integers(1, 3)),
                    **({"top_k": 40} if rng.random() < 0.5 else {"top_p": 0.9}))
    if rng.random() < 0.5:
        body["logprobs"] = int(rng.integers(0, 3))
    return body


def send(port: int, i: int) -> tuple[int, dict | None, float]:
    """(i, the answer's choices by index as (text, token_logprobs), latency), or None for a client
    that leaves early (every tenth): after the first chunk of a stream, or right after sending."""
    body, leave = body_of(i), i % 10 == 9
    start = time.perf_counter()
    connection = http.client.HTTPConnection(HOST, port, timeout=120)
    try:
        connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        if leave:
            if body["stream"]:
                connection.getresponse().readline()
            connection.sock.shutdown(socket.SHUT_RDWR)
            return i, None, 0.0
        response = connection.getresponse()
        assert response.status == 200, response.read()
        choices: dict[int, list] = {}
        if body["stream"]:
            for line in response:
                if line.startswith(b"data: {"):
                    for c in json.loads(line[6:])["choices"]:
                        text, logprobs = choices.setdefault(c["index"], ["", []])
                        choices[c["index"]][0] += c["text"]
                        logprobs += (c["logprobs"] or {}).get("token_logprobs", [])
        else:
            for c in json.loads(response.read())["choices"]:
                choices[c["index"]] = [c["text"], (c["logprobs"] or {}).get("token_logprobs", [])]
        return i, choices, time.perf_counter() - start
    finally:
        connection.close()


def alone(model, body: dict, j: int):
    """What minigpt.generate gives choice j of the body, alone."""
    sampled = body.get("temperature") != 0
    return minigpt.generate(model, body["prompt"], body["max_tokens"], temperature=body.get("temperature", 1.0),
                            top_k=body.get("top_k"), top_p=body.get("top_p"),
                            seed=body["seed"] + j if sampled else None)


def test_under_load_every_answer_is_bitwise_its_solo_generation_and_no_page_is_left_in_use(tiny_model, tokenizer):
    with running_server(tiny_model, max_batch_size=16, kv_cache_tokens=512, max_queue=N_REQUESTS * 2) as (service, url):
        port = int(url.rsplit(":", 1)[1])
        clock = time.perf_counter()
        with ThreadPoolExecutor(CLIENTS) as pool:
            answers = list(pool.map(lambda i: send(port, i), range(N_REQUESTS), timeout=600))  # bounded in time too
        wall = time.perf_counter() - clock
        stats = settled(service)
    assert stats["pages_in_use"] == 0 and stats["pages_in_use"] + stats["pages_cached"] + stats["pages_free"] == \
        stats["pages_total"]
    checked = 0
    for i, choices, _ in answers:
        if choices is None:
            continue
        body = body_of(i)
        assert sorted(choices) == list(range(body.get("n", 1)))
        for j, (text, logprobs) in choices.items():
            expected = alone(tiny_model, body, j)
            assert text == expected.text, (i, j)
            if "logprobs" in body:
                assert logprobs == expected.logprobs, (i, j)
            checked += 1
    latencies = sorted(seconds for _, choices, seconds in answers if choices is not None)
    p50, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
    print(f"\nload test: {N_REQUESTS} requests from {CLIENTS} concurrent clients in {wall:.1f} s, "
          f"{sum(c is None for _, c, _ in answers)} left early; {checked} choices bitwise equal to solo generate; "
          f"latency p50 {p50 * 1e3:.0f} ms, p99 {p99 * 1e3:.0f} ms; engine: {stats['preemptions']} preemptions, "
          f"{stats['evictions']} evictions, {stats['cached_token_hits']} prompt tokens from the prefix cache")
    assert checked > N_REQUESTS * 0.9
    assert stats["preemptions"] + stats["evictions"] > 0  # the pool was tight: the test exercised recomputation
