"""The server against the library: every answer (text and log-probabilities) bitwise what
minigpt.generate or minigpt.score gives alone, through the official `openai` client and through
lm-evaluation-harness's own request; every fault an OpenAI-style 4xx (or a 500 that the engine
survives); a client that leaves has its pages freed."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from serving import HOST, get, post, running_server, settled
from serving import client, model, served  # noqa: F401 (fixtures)

import minigpt
from minigpt.engine import engine as engine_module
from minigpt.loop.sampling import log_softmax, top_log_probs

openai = pytest.importorskip("openai", reason="the openai client is not installed (pip install -e '.[test]')")

PROMPT = "The dog ran to the park"


def ids_of(model, text):
    return minigpt.encode(model.tokenizer, text)


def text_of(model, result):
    return result.text


def test_a_greedy_completion_is_bitwise_generate_alone(model, client):
    answer = client.completions.create(model="random-tiny", prompt=PROMPT, max_tokens=12, temperature=0, logprobs=3)
    alone = minigpt.generate(model, ids_of(model, PROMPT), 12, temperature=0.0, top_logprobs=3)
    choice = answer.choices[0]
    assert choice.text == text_of(model, alone)
    assert choice.logprobs.token_logprobs == alone.logprobs
    assert [list(top.values()) for top in choice.logprobs.top_logprobs] == [[lp for _, lp in step]
                                                                             for step in alone.top_logprobs]
    assert choice.finish_reason == {"eos": "stop", "length": "length"}[alone.finish_reason]
    assert answer.usage.prompt_tokens == len(alone.prompt_ids)
    assert answer.usage.completion_tokens == len(alone.tokens)


def test_a_list_of_strings_is_one_prompt_each_and_max_tokens_defaults_to_16(model, client):
    answer = client.completions.create(model="random-tiny", prompt=["The dog", PROMPT], temperature=0, user="me",
                                       extra_body={"ignore_eos": True})
    for choice, text in zip(answer.choices, ["The dog", PROMPT]):
        alone = minigpt.generate(model, ids_of(model, text), 16, stop_at_eos=False)
        assert choice.text == text_of(model, alone) and len(alone.tokens) == 16
    assert answer.usage.completion_tokens == 32


def test_return_tokens_as_token_ids_names_tokens_by_id_as_vllm(model, client):
    prompt = [464, 3290]
    alone = minigpt.generate(model, prompt, 6, top_logprobs=2)
    for stream in (False, True):
        answer = client.completions.create(model="random-tiny", prompt=prompt, max_tokens=6, temperature=0, logprobs=2,
                                           stream=stream, extra_body={"return_tokens_as_token_ids": True})
        chunks = list(answer) if stream else [answer]
        tokens = [t for c in chunks for t in c.choices[0].logprobs.tokens]
        tops = [top for c in chunks for top in c.choices[0].logprobs.top_logprobs]
        assert tokens == [f"token_id:{t}" for t in alone.tokens]
        assert tops == [{f"token_id:{t}": lp for t, lp in step} for step in alone.top_logprobs]


def test_n_seeded_choices_sample_with_seed_plus_their_index(model, client):
    answer = client.completions.create(model="random-tiny", prompt=[[464, 3290], [11]], max_tokens=8, n=3, seed=41,
                                       temperature=0.9, top_p=0.95, logprobs=0,
                                       extra_body={"top_k": 50})
    assert [c.index for c in answer.choices] == list(range(6))
    for c in answer.choices:
        prompt = [[464, 3290], [11]][c.index // 3]
        alone = minigpt.generate(model, prompt, 8, temperature=0.9, top_p=0.95, top_k=50, seed=41 + c.index % 3)
        assert (c.text, c.logprobs.token_logprobs) == (text_of(model, alone), alone.logprobs)
        assert c.logprobs.top_logprobs is None  # logprobs 0: the chosen tokens' only
    assert len({c.text for c in answer.choices[:3]}) > 1  # the seeds differ
    assert answer.usage.prompt_tokens == 3  # each prompt once, as OpenAI counts, however many choices
    assert answer.usage.completion_tokens == sum(len(c.logprobs.token_logprobs) for c in answer.choices)


def test_a_stream_adds_up_to_the_whole_answer_and_reports_usage(model, client):
    chunks = list(client.completions.create(model="random-tiny", prompt=PROMPT, max_tokens=10, seed=3, logprobs=2,
                                            stream=True, stream_options={"include_usage": True}))
    alone = minigpt.generate(model, ids_of(model, PROMPT), 10, temperature=1.0, seed=3, top_logprobs=2)
    pieces = [c.choices[0] for c in chunks if c.choices]
    assert "".join(p.text for p in pieces) == text_of(model, alone)
    assert [lp for p in pieces for lp in p.logprobs.token_logprobs] == alone.logprobs
    assert pieces[-1].finish_reason is not None and all(p.finish_reason is None for p in pieces[:-1])
    assert chunks[-1].usage.completion_tokens == len(alone.tokens) and not chunks[-1].choices


def test_stop_strings_end_the_text_as_the_library_does(model, client):
    alone = minigpt.generate(model, ids_of(model, PROMPT), 12, stop_at_eos=False)
    stop = text_of(model, alone)[5:9]  # a piece of what greedy decoding writes
    expected = minigpt.generate(model, ids_of(model, PROMPT), 12, stop=[stop])
    for stream in (False, True):
        answer = client.completions.create(model="random-tiny", prompt=PROMPT, max_tokens=12, temperature=0,
                                           stop=stop, stream=stream)
        choices = list(answer) if stream else [answer]
        text = "".join(c.choices[0].text for c in choices)
        assert text == text_of(model, expected) and stop not in text
        assert choices[-1].choices[0].finish_reason == "stop"


def test_echo_puts_the_prompt_and_its_scores_first(model, client):
    ids = ids_of(model, PROMPT)
    answer = client.completions.create(model="random-tiny", prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    lp = answer.choices[0].logprobs
    assert answer.choices[0].text == PROMPT and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[1:] == minigpt.score(model, ids).tolist()
    assert lp.text_offset == [len(model.tokenizer.decode(ids[:i])) for i in range(len(ids))]
    streamed = list(client.completions.create(model="random-tiny", prompt=PROMPT, max_tokens=3, echo=True,
                                              temperature=0, stream=True))
    alone = minigpt.generate(model, ids, 3)
    assert "".join(c.choices[0].text for c in streamed) == PROMPT + text_of(model, alone)


def test_lm_eval_loglikelihood_request_scores_bitwise_and_is_greedy_matches_the_model(model, served):
    contexts, continuations = [[464, 3290, 4966, 284], [40, 1101]], [[262, 3952, 13], [1180]]
    prompts = [c + k for c, k in zip(contexts, continuations)]
    status, _, answer = post(served[1], "/v1/completions", {"model": "random-tiny", "prompt": prompts,
                                                            "temperature": 0, "max_tokens": 1, "logprobs": 1,
                                                            "seed": 1234, "echo": True})
    assert status == 200
    for choice, context, ids in zip(sorted(answer["choices"], key=lambda c: c["index"]), contexts, prompts):
        ctxlen, logprobs = len(context), choice["logprobs"]
        assert sum(logprobs["token_logprobs"][ctxlen:-1]) == sum(minigpt.score(model, ids)[ctxlen - 1:].tolist())
        is_greedy = all(lp == max(top.values()) for lp, top in zip(logprobs["token_logprobs"][ctxlen:-1],
                                                                     logprobs["top_logprobs"][ctxlen:-1]))
        logits = model.forward(ids)
        assert is_greedy == all(int(np.argmax(logits[i - 1])) == ids[i] for i in range(ctxlen, len(ids)))


def test_tokenize_detokenize_and_tokenizer_info_speak_vllm_shapes(model, served):
    url = served[1]
    status, _, tokens = post(url, "/tokenize", {"prompt": "<|endoftext|>" + PROMPT, "add_special_tokens": False,
                                                "return_token_strs": True})
    assert status == 200 and tokens["tokens"] == [50256, *ids_of(model, PROMPT)]  # lm-eval finds eos so
    assert tokens["count"] == len(tokens["tokens"]) and tokens["max_model_len"] == model.config.n_positions
    assert "".join(tokens["token_strs"][1:]) == PROMPT
    assert post(url, "/detokenize", {"tokens": tokens["tokens"][1:]})[2] == {"prompt": PROMPT}
    status, info = get(url, "/tokenizer_info")
    assert status == 200 and info["eos_token"] == "<|endoftext|>" and info["tokenizer_class"] == "GPT2Tokenizer"
    assert get(url, "/health") == (200, {"status": "ok"})
    assert get(url, "/v1/models")[1]["data"][0]["id"] == "random-tiny"


def answer_of(url: str, body: dict) -> list[tuple[str, list | None, list | None]]:
    """The choices of a completion, streamed or whole, as (text, token_logprobs, top_logprobs values) by index."""
    host, port = url.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    connection.request("POST", "/v1/completions", json.dumps(body))
    response = connection.getresponse()
    assert response.status == 200
    pieces = ([json.loads(line[6:]) for line in response if line.startswith(b"data: {")] if body["stream"]
              else [json.loads(response.read())])
    connection.close()
    choices: dict[int, list] = {}
    for piece in pieces:
        for c in piece["choices"]:
            text, logprobs, top = choices.setdefault(c["index"], ["", None, None])
            choices[c["index"]][0] = text + c["text"]
            if c["logprobs"] is not None:
                choices[c["index"]][1] = (logprobs or []) + c["logprobs"]["token_logprobs"]
                if c["logprobs"]["top_logprobs"] is not None:
                    choices[c["index"]][2] = (top or []) + [None if t is None else list(t.values())
                                                            for t in c["logprobs"]["top_logprobs"]]
    return [tuple(choices[i]) for i in sorted(choices)]


def expected_choice(model, ids, body, j):
    """What generate and score give choice j of prompt `ids` alone, as answer_of shapes it."""
    n_top = body.get("logprobs")
    sampled = body["temperature"] != 0
    alone = minigpt.generate(model, ids, body["max_tokens"], temperature=body["temperature"],
                             seed=body["seed"] + j if sampled else None, top_logprobs=n_top or 0)
    text, logprobs, top = text_of(model, alone), None, None
    if n_top is not None:
        logprobs = alone.logprobs
        top = [[lp for _, lp in step] for step in alone.top_logprobs] if n_top else None
    if body["echo"]:
        text = model.tokenizer.decode(ids) + text
        if n_top is not None:
            scores = minigpt.score(model, ids).tolist() if len(ids) > 1 else []
            logprobs = [None, *scores, *logprobs]
            if n_top:
                prompt_top = [[lp for _, lp in top_log_probs(log_softmax(row), n_top)]
                              for row in model.forward(ids)[:-1]]
                top = [None, *prompt_top, *top]
    return text, logprobs, top


@given(prompts=st.lists(st.lists(st.integers(0, 50256), min_size=1, max_size=24), min_size=1, max_size=2),
       max_tokens=st.integers(0, 6), temperature=st.sampled_from([0, 0.7]), seed=st.integers(0, 2**20),
       n=st.integers(1, 2), logprobs=st.sampled_from([None, 0, 2]), echo=st.booleans(), stream=st.booleans())
def test_every_completion_streamed_or_whole_is_bitwise_solo_generate_and_score(
        model, served, prompts, max_tokens, temperature, seed, n, logprobs, echo, stream):
    body = {"prompt": prompts, "max_tokens": max_tokens, "temperature": temperature, "seed": seed, "n": n,
            "echo": echo, "stream": stream, **({} if logprobs is None else {"logprobs": logprobs})}
    got = answer_of(served[1], body)
    assert len(got) == len(prompts) * n
    for index, choice in enumerate(got):
        text, token_logprobs, top = expected_choice(model, prompts[index // n], body, index % n)
        assert choice[0] == text and choice[1] == token_logprobs
        assert choice[2] == top


BAD_BODIES = [  # (body, status, param)
    ({"prompt": "x", "model": "gpt-4"}, 404, "model"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature"),
    ({"prompt": "x", "max_tokens": "16"}, 400, "max_tokens"),
    ({"prompt": "x", "n": 0}, 400, "n"),
    ({"prompt": "x", "logprobs": 21}, 400, "logprobs"),
    ({"prompt": "x", "echo": "yes"}, 400, "echo"),
    ({"prompt": "x", "seed": -1}, 400, "seed"),
    ({"prompt": "x", "top_p": 0}, 400, "top_p"),
    ({"prompt": "x", "stop": [""]}, 400, "stop"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ({"prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
    ({"prompt": "x", "suffix": "!"}, 400, "suffix"),
    ({"prompt": "x", "best_of": 21}, 400, "best_of"),
    ({"prompt": "x", "n": 3, "best_of": 2}, 400, "best_of"),
    ({"prompt": "x", "best_of": 2, "stream": True}, 400, "best_of"),
    ({"prompt": "x", "logit_bias": {"50257": -100}}, 400, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"dog": -100}}, 400, "logit_bias"),
    ({"prompt": "x", "logit_bias": {"50256": -101}}, 400, "logit_bias"),
    ({"prompt": "x", "presence_penalty": 2.5}, 400, "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": -3}, 400, "frequency_penalty"),
    ({"prompt": "x", "repetition_penalty": 0}, 400, "repetition_penalty"),
    ({"prompt": "x", "min_tokens": 17}, 400, "min_tokens"),
    ({"prompt": "x", "min_tokens": -1}, 400, "min_tokens"),
    ({"prompt": [1, "a"]}, 400, "prompt"),
    ({"prompt": []}, 400, "prompt"),
    ({"prompt": [[1, 2], [3, 50257]]}, 400, "prompt"),
    ({"prompt": [1] * 250, "max_tokens": 16}, 400, "prompt"),
    ({}, 400, "prompt"),
]


@pytest.mark.parametrize("body, status, param", BAD_BODIES, ids=[json.dumps(b)[:40] for b, _, _ in BAD_BODIES])
def test_a_bad_request_is_an_openai_error_naming_its_field(served, body, status, param):
    got, _, answer = post(served[1], "/v1/completions", body)
    assert got == status
    assert set(answer) == {"error"} and set(answer["error"]) == {"message", "type", "param", "code"}
    assert answer["error"]["param"] == param


def test_a_prompt_beyond_the_context_says_so_in_openai_s_code(served):
    _, _, answer = post(served[1], "/v1/completions", {"prompt": [1] * 250, "max_tokens": 16})
    assert answer["error"]["code"] == "context_length_exceeded" and "256" in answer["error"]["message"]


@pytest.mark.parametrize("raw, status", [(b"{not json", 400), (b"[1, 2]", 400), (b"\xff\xfe", 400),
                                         (b'{"prompt": "' + b"a" * (9 * 2**20) + b'"}', 413)],
                         ids=["malformed", "not an object", "not utf-8", "too large"])
def test_a_body_that_is_not_a_json_object_or_too_large_is_a_4xx(served, raw, status):
    got, _, answer = post(served[1], "/v1/completions", None, raw=raw)
    assert got == status and answer["error"]["message"]


def test_chat_completions_says_gpt2_has_no_chat_template(served):
    status, _, answer = post(served[1], "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and "chat template" in answer["error"]["message"]


def test_a_full_queue_is_a_429_with_retry_after(model):
    with running_server(model, max_queue=0, max_batch_size=1) as (service, url):
        connection = http.client.HTTPConnection(HOST, int(url.rsplit(":", 1)[1]), timeout=60)
        connection.request("POST", "/v1/completions", json.dumps(
            {"prompt": [1, 2], "max_tokens": 200, "ignore_eos": True, "stream": True}))
        response = connection.getresponse()
        response.readline()  # its first chunk: it is running
        status, headers, answer = post(url, "/v1/completions", {"prompt": [1], "max_tokens": 1})
        connection.sock.shutdown(socket.SHUT_RDWR)
        connection.close()
        assert status == 429 and headers["retry-after"] == "1" and answer["error"]["type"] == "rate_limit_error"
        assert settled(service)["pages_in_use"] == 0


@pytest.mark.parametrize("stream", [True, False], ids=["mid-stream", "while waiting"])
def test_a_client_that_leaves_has_its_request_cancelled_and_its_pages_freed(model, stream):
    with running_server(model, max_batch_size=2) as (service, url):
        connection = http.client.HTTPConnection(HOST, int(url.rsplit(":", 1)[1]), timeout=60)
        connection.request("POST", "/v1/completions", json.dumps(
            {"prompt": list(range(100)), "max_tokens": 150, "ignore_eos": True, "stream": stream}))
        if stream:
            connection.getresponse().readline()
        deadline = time.monotonic() + 30
        while not service.engine.in_batch() and time.monotonic() < deadline:
            time.sleep(0.01)
        job = service.engine.in_batch()[0]
        connection.sock.shutdown(socket.SHUT_RDWR)  # gone, whoever else holds the socket (the response does)
        connection.close()
        stats = settled(service)
        assert job.status is engine_module.Status.CANCELLED and len(job.seq.tokens) < 150  # stopped, not run to its end
        assert stats["pages_in_use"] == 0 and service.in_flight == 0 and not service.engine_thread.tickets


def fail_steps_feeding(token: int, monkeypatch) -> None:
    """Make every engine step whose forward feeds `token` raise RuntimeError("injected fault")."""
    forward = engine_module.forward_batch

    def failing(gpt, feeds, caches, keep):
        if any(token in list(f) for f in feeds):
            raise RuntimeError("injected fault")
        return forward(gpt, feeds, caches, keep)

    monkeypatch.setattr(engine_module, "forward_batch", failing)


def test_an_error_inside_a_step_fails_its_request_with_a_500_and_the_engine_goes_on(model, served, monkeypatch):
    fail_steps_feeding(7777, monkeypatch)
    status, _, answer = post(served[1], "/v1/completions", {"prompt": [7777, 1], "max_tokens": 3})
    assert status == 500 and "injected fault" in answer["error"]["message"]
    status, _, answer = post(served[1], "/v1/completions", {"prompt": [1, 2], "max_tokens": 3, "temperature": 0})
    assert status == 200 and answer["choices"][0]["logprobs"] is None
    assert settled(served[0])["pages_in_use"] == 0


def test_a_failed_step_still_answers_a_request_that_left_the_engine_at_its_start(model, monkeypatch):
    """A request with nothing to generate leaves the engine at the start of a step that then fails
    for another request: it gets its answer, the other its error, and the engine thread goes idle
    and stops (no ticket left behind, no step after step with nothing to do)."""
    from requesting import new_request
    from minigpt.server.engine_thread import EngineThread, Ticket
    from minigpt.server.metrics import Metrics

    fail_steps_feeding(7777, monkeypatch)
    updates = {}
    engine = minigpt.Engine(model, max_batch_size=4)
    asked = (("failing", [7777, 1], 3), ("nothing to generate", [1, 2], 0))
    jobs = engine.jobs_for([new_request(model, ids, n) for _, ids, n in asked])
    tickets = [Ticket(job, lambda u, name=name: updates.setdefault(name, []).append(u))
               for job, (name, _, _) in zip(jobs, asked)]
    thread = EngineThread(engine, Metrics(engine, "random-tiny"))
    thread.submit(tickets)
    thread.thread.start()
    deadline = time.monotonic() + 30
    while len(updates) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    thread.stopping = True  # EngineThread.stop, with a bound on the wait
    thread.wake.set()
    thread.thread.join(30)
    assert [u.final for u in updates["failing"]] == [True] and "injected fault" in str(updates["failing"][0].error)
    [answer] = updates["nothing to generate"]
    assert answer.final and answer.error is None and answer.result.tokens == []
    assert not thread.tickets and not thread.thread.is_alive()


def start_cli(*options: str) -> tuple[subprocess.Popen, str]:
    """`python -m minigpt serve` in a subprocess on an ephemeral port; (process, URL) once it listens."""
    process = subprocess.Popen([sys.executable, "-m", "minigpt", "serve", "--model", "random-tiny", "--port", "0",
                                *options], stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONUNBUFFERED": "1"})
    line = process.stderr.readline()
    assert " listening on http://127.0.0.1:" in line, line
    return process, line.split(" on ")[1].split()[0]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_ends_what_is_running_and_exits_0(signum):
    process, url = start_cli("--max-batch-size", "2")
    try:
        connection = http.client.HTTPConnection(HOST, int(url.rsplit(":", 1)[1]), timeout=60)
        connection.request("POST", "/v1/completions", json.dumps({"prompt": [1, 2], "max_tokens": 20, "stream": True,
                                                                  "ignore_eos": True}))
        response = connection.getresponse()
        response.readline()
        process.send_signal(signum)
        rest = response.read().decode()  # the request runs to its end
        assert rest.rstrip().endswith("data: [DONE]")
        assert process.wait(timeout=30) == 0
        assert "Traceback" not in process.stderr.read()
    finally:
        process.kill()
        process.wait()


def test_the_command_s_usage_errors_exit_2_and_a_port_in_use_is_one_line(served):
    bad = subprocess.run([sys.executable, "-m", "minigpt", "serve", "--port", "70000"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error: argument --port")
    port = served[1].rsplit(":", 1)[1]
    taken = subprocess.run([sys.executable, "-m", "minigpt", "serve", "--model", "random-tiny", "--port", port],
                           capture_output=True, text=True, timeout=60)
    assert taken.returncode == 1 and taken.stderr.startswith("error: cannot listen on 127.0.0.1:")
    assert len(taken.stderr.splitlines()) == 1


def test_a_signal_at_once_after_the_listening_line_still_exits_0():
    process, _ = start_cli()
    try:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=30) == 0
    finally:
        process.kill()
        process.wait()


def test_serve_without_the_extra_is_one_line_saying_how_to_install_it():
    code = ("import sys; sys.modules['uvicorn'] = None; from minigpt.cli import main; "
            "sys.exit(main(['serve', '--model', 'random-tiny', '--port', '0']))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr == ("error: serve needs the serve extra (uvicorn is not installed): "
                                                    "pip install 'minigpt[serve]'\n")


def test_sampling_without_a_seed_draws_one_so_two_answers_differ(client):
    texts = [client.completions.create(model="random-tiny", prompt=PROMPT, max_tokens=8).choices[0].text
             for _ in range(2)]
    assert texts[0] != texts[1]  # temperature 1 by default, near-uniform over 50,257 tokens: never equal by chance
