"""The server as a state machine: Hypothesis draws what concurrent clients do to a random-tiny server
on 127.0.0.1 whose page pool is drawn from the smallest that fits the largest request up (so it
evicts and preempts) with the prefix cache on. Rules: send a request (prompts that share a one- or
two-page prefix, or are exactly it; greedy or seeded sampling, n of 1 or 2, stop strings, streamed
or whole), read a few chunks of a stream, leave a stream mid-way (the socket shut), read an answer
to its end, and a burst of clients in threads through the `openai` client at once. After every
rule the pool's gauges add up; at the end, with nothing in flight, no page is in use, /metrics'
counters agree with what was served (choices by finish reason, prompt and generated tokens,
preemptions), and every answer read to its end is bitwise minigpt.generate's for that choice alone."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import event, settings, strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, consumes, initialize, invariant, rule

from serving import HOST, running_server, scrape, settled

import minigpt
from minigpt.engine.paging import PAGE

openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install -e '.[test]')")

MAX_TOKENS, MAX_TAIL = 16, 12
PREFIXES = [list(range(300, 300 + PAGE)), list(range(500, 500 + 2 * PAGE))]  # shared beginnings: 1 and 2 pages
LARGEST = 2 * PAGE + MAX_TAIL + MAX_TOKENS  # positions of the largest request a rule sends


@st.composite
def bodies(draw) -> dict:
    """A request body: a prompt beginning with a shared prefix (or exactly it: a whole number of
    pages, fully cached the second time), greedy or seeded sampling, maybe stop strings."""
    prefix = draw(st.sampled_from([[], *PREFIXES]))
    prompt = prefix + draw(st.lists(st.integers(0, 50255), min_size=0 if prefix else 1, max_size=MAX_TAIL))
    body = {"prompt": prompt, "max_tokens": draw(st.integers(1, MAX_TOKENS)), "logprobs": draw(st.integers(0, 2)),
            "stream": draw(st.booleans())}
    if draw(st.booleans()):
        body["temperature"] = 0
    else:
        body.update(temperature=0.8, seed=draw(st.integers(0, 2**16)), n=draw(st.integers(1, 2)))
    if draw(st.integers(0, 3)) == 0:
        body["stop"] = [draw(st.sampled_from(["e", "a", "the", "\n"]))]
    if body["stream"]:
        body["stream_options"] = {"include_usage": True}
    return body


class Answer:
    """What a client was told: its choices by index as [text, token log-probabilities, finish reason],
    and the usage."""

    def __init__(self, body: dict):
        self.body, self.choices, self.usage = body, {}, None

    def take(self, chunk: dict) -> None:
        assert "error" not in chunk, chunk
        for c in chunk["choices"]:
            text, logprobs, _ = self.choices.setdefault(c["index"], ["", [], None])
            self.choices[c["index"]][0] += c["text"]
            logprobs += c["logprobs"]["token_logprobs"]
            self.choices[c["index"]][2] = c["finish_reason"]
        self.usage = chunk.get("usage") or self.usage


class Client(Answer):
    """One request on a connection of its own, read as the rules say."""

    def __init__(self, port: int, body: dict):
        super().__init__(body)
        self.done = False  # data: [DONE] read
        self.connection = http.client.HTTPConnection(HOST, port, timeout=60)
        self.connection.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        self.response = None

    def answer(self) -> http.client.HTTPResponse:
        if self.response is None:
            self.response = self.connection.getresponse()
            assert self.response.status == 200, self.response.read()
        return self.response

    def read(self, chunks: int) -> None:
        """Up to `chunks` more events of a stream (fewer if it ends)."""
        while chunks > 0 and not self.done:
            line = self.answer().readline()
            assert line, "the stream ended without data: [DONE]"
            if line.startswith(b"data: [DONE]"):
                self.done = True
            elif line.startswith(b"data: {"):
                self.take(json.loads(line[6:]))
                chunks -= 1

    def finish(self) -> None:
        if self.body["stream"]:
            self.read(10**6)
        else:
            self.take(json.loads(self.answer().read()))
            self.done = True
        self.connection.close()

    def leave(self) -> None:
        self.connection.sock.shutdown(socket.SHUT_RDWR)
        self.connection.close()


def through_openai(port: int, body: dict) -> Answer:
    """The body sent by the official client, read to its end."""
    client = openai.OpenAI(base_url=f"http://{HOST}:{port}/v1", api_key="unused", max_retries=0, timeout=60)
    fields = {k: v for k, v in body.items() if k not in ("prompt", "stream", "stream_options")}
    answer = Answer(body)
    if body["stream"]:
        for chunk in client.completions.create(model="random-tiny", prompt=body["prompt"], stream=True,
                                               stream_options={"include_usage": True}, **fields):
            answer.take(chunk.model_dump())
    else:
        answer.take(client.completions.create(model="random-tiny", prompt=body["prompt"], **fields).model_dump())
    return answer


def alone(model, body: dict, j: int):
    """What minigpt.generate gives choice j of the body, alone."""
    sampled = body.get("temperature") != 0
    return minigpt.generate(model, body["prompt"], body["max_tokens"], temperature=body.get("temperature", 1.0),
                            seed=body["seed"] + j if sampled else None, stop=body.get("stop"))


class ServerMachine(RuleBasedStateMachine):
    clients = Bundle("clients")
    model = None  # random-tiny, loaded once for every example (the fixture below)

    def __init__(self):
        super().__init__()
        self.stack = contextlib.ExitStack()
        self.service = self.url = None
        self.read_whole: list[Answer] = []  # answers read to their end
        self.left: list[Client] = []  # streams left mid-way
        self.open: list[Client] = []

    @initialize(pages=st.integers(-(-LARGEST // PAGE), 8), max_batch_size=st.sampled_from([3, 8]))
    def start(self, pages: int, max_batch_size: int) -> None:
        self.service, self.url = self.stack.enter_context(
            running_server(self.model, max_batch_size=max_batch_size, kv_cache_tokens=pages * PAGE))
        self.port = int(self.url.rsplit(":", 1)[1])

    @rule(target=clients, body=bodies())
    def send(self, body: dict) -> Client:
        client = Client(self.port, body)
        self.open.append(client)
        return client

    @rule(client=clients, chunks=st.integers(1, 4))
    def read(self, client: Client, chunks: int) -> None:
        if client.body["stream"] and client in self.open:
            client.read(chunks)

    @rule(client=consumes(clients))
    def leave_mid_stream(self, client: Client) -> None:
        """Shut the socket after at least one chunk (so the request reached the engine)."""
        if client.body["stream"] and client in self.open:
            client.read(1)
            self.open.remove(client)
            if client.done:  # it ended before the client could leave
                self.read_whole.append(client)
            else:
                client.leave()
                self.left.append(client)

    @rule(client=consumes(clients))
    def read_to_the_end(self, client: Client) -> None:
        if client in self.open:
            client.finish()
            self.open.remove(client)
            self.read_whole.append(client)

    @rule(burst=st.lists(bodies(), min_size=2, max_size=3))
    def concurrent_clients(self, burst: list[dict]) -> None:
        with ThreadPoolExecutor(len(burst)) as pool:
            self.read_whole += pool.map(lambda body: through_openai(self.port, body), burst, timeout=120)

    @invariant()
    def the_pool_adds_up(self) -> None:
        if self.service is not None:
            m = scrape(self.url)
            pages = [m["minigpt:kv_cache_pages", ("state", s)] for s in ("in_use", "cached", "free")]
            assert sum(pages) == self.service.engine.stats()["pages_total"], pages

    def teardown(self) -> None:
        try:
            if self.service is not None:
                for client in self.open:
                    client.finish()
                self.read_whole += self.open
                self.check_the_end()
        finally:
            self.stack.close()

    def check_the_end(self) -> None:
        stats = settled(self.service)
        m = scrape(self.url)
        assert stats["pages_in_use"] == 0 and m["minigpt:kv_cache_pages", ("state", "in_use")] == 0
        assert m["minigpt:num_requests_running", ] == m["minigpt:num_requests_waiting", ] == 0
        n = [len(c.choices) for c in self.read_whole]
        assert n == [c.body.get("n", 1) for c in self.read_whole]
        reasons = {r: m.get(("minigpt:request_success_total", ("finished_reason", r)), 0)
                   for r in ("stop", "length", "abort", "error")}
        whole = [choice for c in self.read_whole for choice in c.choices.values()]
        left = sum(c.body.get("n", 1) for c in self.left)
        assert reasons["error"] == 0
        for r in ("stop", "length"):  # a stream left late may have ended first
            assert 0 <= reasons[r] - sum(reason == r for _, _, reason in whole) <= left, (r, reasons)
        assert reasons["stop"] + reasons["length"] + reasons["abort"] == len(whole) + left, reasons
        prompts = sum(len(c.body["prompt"]) * len(c.choices) for c in self.read_whole)
        assert prompts <= m["minigpt:prompt_tokens_total", ] <= prompts + sum(
            len(c.body["prompt"]) * c.body.get("n", 1) for c in self.left)
        assert m["minigpt:prefix_cache_queries_total", ] == m["minigpt:prompt_tokens_total", ]
        cached = sum(c.usage["prompt_tokens_details"]["cached_tokens"] for c in self.read_whole)  # first choices'
        assert cached <= m["minigpt:prefix_cache_hits_total", ] <= m["minigpt:prefix_cache_queries_total", ]
        made = sum(len(logprobs) for _, logprobs, _ in whole)
        assert made == sum(c.usage["completion_tokens"] for c in self.read_whole)
        assert [c.usage["prompt_tokens"] for c in self.read_whole] == [len(c.body["prompt"]) for c in self.read_whole]
        received = sum(len(logprobs) for c in self.left for _, logprobs, _ in c.choices.values())
        assert made + received <= m["minigpt:generation_tokens_total", ] <= made + sum(
            c.body["max_tokens"] * c.body.get("n", 1) for c in self.left)
        assert m["minigpt:num_preemptions_total", ] == stats["preemptions"]
        for what, seen in (("preempted", stats["preemptions"]), ("left mid-stream", left),
                           ("prefix cache hit", m["minigpt:prefix_cache_hits_total", ]),
                           ("aborted", reasons["abort"]), ("stopped", reasons["stop"])):
            event(f"{what}: {'yes' if seen else 'no'}")  # --hypothesis-show-statistics shows what the examples did
        for c in self.read_whole:
            for j, (text, logprobs, reason) in c.choices.items():
                expected = alone(self.model, c.body, j)
                assert (text, logprobs) == (expected.text, expected.logprobs), (c.body, j)
                assert reason == {"eos": "stop"}.get(expected.finish_reason, expected.finish_reason)


ServerMachine.TestCase.settings = settings(max_examples=8, stateful_step_count=10)


@pytest.fixture(autouse=True, scope="module")
def machine_model(tiny_model, tokenizer):
    ServerMachine.model = tiny_model


TestEveryAnswerIsItsChoiceAloneMetricsCountWhatWasServedNoPageIsLeft = ServerMachine.TestCase
