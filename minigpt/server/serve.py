"""`python -m minigpt serve`'s routes: OpenAI's completions API over HTTP, on one Engine that every request shares.

The HTTP side (Starlette) checks a body, hands its choices to the engine thread
(minigpt.server.engine_thread) as Tickets, and writes the Updates back as JSON or server-sent
events; with the exact kernels each answer is bitwise `minigpt.generate`'s alone (docs/serving.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect, Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from ..engine.engine import Engine
from ..engine.job import Job
from .completion_request import (APIError, CompletionRequest, check_model_name, completion_request, encode_text,
                                 library_error, parse_json)
from .completion_response import ChoiceStream, choice_json, envelope, usage_json
from . import page
from .engine_thread import EngineThread, Preparation, Ticket, Update, shutting_down
from .metrics import Metrics
from ..errors import InputError, MinigptError, check_ids
from ..loading.model import Model
from ..loop.sequence import GenerationResult
from ..loading.tokenizer import no_tokenizer, token_text

log = logging.getLogger("minigpt.server.serve")
MAX_BODY_BYTES = 8 * 2**20  # a body beyond this is refused (413) before it is read in full
RETRY_AFTER_SECONDS = 1
SHUTDOWN_GRACE_SECONDS = 3  # on SIGINT/SIGTERM, running requests get this long to finish, then are answered 503
BODY_SECONDS = 30  # and its body within this of its headers


# ------------------------------------------------------------------------------- HTTP side


class Service:
    """What the HTTP handlers share: the model, its name, the engine thread and the queue's bound."""

    def __init__(self, model: Model, engine: Engine, served_name: str, max_queue: int):
        self.model, self.engine, self.served_name = model, engine, served_name
        self.metrics = Metrics(engine, served_name)
        self.engine_thread = EngineThread(engine, self.metrics)
        self.capacity = engine.max_batch_size + max_queue  # choices in flight: the running and the waiting
        self.in_flight = 0
        self.draining = False  # shutting down: new completions are refused (503)
        self.preparation = Preparation()

    def shutting_down(self) -> None:
        """Refuse new completions; after SHUTDOWN_GRACE_SECONDS end those still running, or still
        being prepared, with a 503 (a whole answer) or an error event and [DONE] (a stream), so that
        every client hears why."""
        self.draining = True
        asyncio.get_running_loop().call_later(SHUTDOWN_GRACE_SECONDS, self.stop_now)

    def stop_now(self) -> None:
        self.preparation.stop()
        self.engine_thread.abort(shutting_down())

    def app(self) -> Starlette:
        routes = [Route("/health", self.health), Route("/v1/models", self.models),
                  Route("/v1/completions", self.completions, methods=["POST"]),
                  Route("/v1/chat/completions", self.chat, methods=["POST"]),
                  Route("/tokenize", self.tokenize, methods=["POST"]),
                  Route("/detokenize", self.detokenize, methods=["POST"]),
                  Route("/tokenizer_info", self.tokenizer_info), *page.routes(self)]
        return Starlette(routes=routes, lifespan=self.lifespan,
                         exception_handlers={404: self.not_found, 405: self.not_allowed, Exception: self.failed})

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        self.engine_thread.thread.start()
        try:
            yield
        finally:
            self.engine_thread.stop()

    # ------------------------------------------------------------------ small endpoints

    async def health(self, request: HTTPRequest) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(self, request: HTTPRequest) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": self.served_name, "object": "model", "created": 0, "owned_by": "minigpt",
             "max_model_len": self.model.config.n_positions}]})

    async def chat(self, request: HTTPRequest) -> Response:
        return error_response(APIError("GPT-2 has no chat template: this server answers /v1/completions only",
                                       None, "chat_not_supported"))

    async def not_found(self, request: HTTPRequest, exc) -> Response:
        return error_response(APIError(f"no such endpoint: {request.url.path}", None, "not_found", 404))

    async def not_allowed(self, request: HTTPRequest, exc) -> Response:
        return error_response(APIError(f"{request.method} is not allowed on {request.url.path}", None,
                                       "method_not_allowed", 405))

    async def failed(self, request: HTTPRequest, exc: Exception) -> Response:
        """A fault of the server's own, never of the request: logged, and a 500 in OpenAI's shape."""
        log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
        return error_response(APIError(f"internal error: {type(exc).__name__}", None, "internal_error", 500,
                                       "server_error"))

    async def tokenizer_info(self, request: HTTPRequest) -> Response:
        """GPT-2's tokenizer_config.json, as vLLM's /tokenizer_info gives a model's."""
        eos = token_text(self.tokenizer(), self.model.config.eos_token_id)
        return JSONResponse({"tokenizer_class": "GPT2Tokenizer", "bos_token": eos, "eos_token": eos, "unk_token": eos,
                             "pad_token": None, "add_prefix_space": False,
                             "model_max_length": self.model.config.n_positions})

    async def tokenize(self, request: HTTPRequest) -> Response:
        """vLLM's /tokenize: {"prompt": text} -> {"count", "max_model_len", "tokens", "token_strs"}."""
        async def answer(body: dict) -> Response:
            if "messages" in body:
                raise APIError("GPT-2 has no chat template: tokenize a prompt, not messages", "messages")
            self.check_fields(body, ("model", "prompt", "add_special_tokens", "return_token_strs"))
            if not isinstance(body.get("prompt"), str):
                raise APIError("prompt must be a string", "prompt")
            tokenizer = self.tokenizer()
            ids = await run_in_threadpool(encode_text, self.model, body["prompt"])  # GPT-2 adds no special tokens
            strs = [token_text(tokenizer, t) for t in ids] if body.get("return_token_strs") else None
            return JSONResponse({"count": len(ids), "max_model_len": self.model.config.n_positions, "tokens": ids,
                                 "token_strs": strs})
        return await self.answer_json_body(request, answer)

    async def detokenize(self, request: HTTPRequest) -> Response:
        """vLLM's /detokenize: {"tokens": ids} -> {"prompt": text}."""
        async def answer(body: dict) -> Response:
            self.check_fields(body, ("model", "tokens"))
            tokens = body.get("tokens")
            try:
                ids = check_ids_field(tokens, self.model.config.vocab_size)
            except InputError as e:
                raise APIError(f"tokens: {e}", "tokens") from None
            return JSONResponse({"prompt": self.tokenizer().decode(ids)})
        return await self.answer_json_body(request, answer)

    def check_fields(self, body: dict, fields: tuple[str, ...]) -> None:
        unknown = [key for key in body if key not in fields]
        if unknown:
            raise APIError(f"Unrecognized request argument supplied: {unknown[0]}", unknown[0])
        check_model_name(body.get("model"), self.served_name)

    def tokenizer(self):
        if self.model.tokenizer is None:
            raise APIError(no_tokenizer(self.model.config.vocab_size), None, "no_tokenizer")
        return self.model.tokenizer

    async def answer_json_body(self, request: HTTPRequest, answer) -> Response:
        """answer(body) for a JSON body within the size limit; any APIError as OpenAI's error body."""
        try:
            return await answer(await run_in_threadpool(parse_json, await read_body(request)))
        except APIError as e:
            return error_response(e)

    # ------------------------------------------------------------------ completions

    async def completions(self, request: HTTPRequest) -> Response:
        try:
            if self.draining:
                raise shutting_down()
            asked, jobs = await self.preparation.run(self.prepare, await read_body(request))  # encoding takes time
            choices = len(jobs)
            if choices > self.capacity - self.in_flight:
                raise APIError(f"the server is busy: {choices} candidates asked for, room for "
                               f"{max(self.capacity - self.in_flight, 0)} now (--max-batch-size + --max-queue in "
                               "flight); retry later", None, "queue_full", 429, "rate_limit_error")
        except APIError as e:
            return error_response(e)
        updates: asyncio.Queue[Update] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def deliver(update: Update) -> None:  # from the engine thread
            loop.call_soon_threadsafe(self.arrived, updates, update)

        tickets = [Ticket(job, deliver) for job in jobs]
        self.in_flight += len(tickets)
        self.engine_thread.submit(tickets)
        identity = f"cmpl-{uuid.uuid4().hex}"
        if asked.stream:
            return StreamingResponse(self.events(identity, asked, tickets, updates),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return await self.whole(request, identity, asked, tickets, updates)

    def prepare(self, body: bytes) -> tuple[CompletionRequest, list[Job]]:
        """A body parsed and checked into a CompletionRequest (off the event loop), and a job per candidate
        (Engine.jobs_for), refusing a prompt that could never fit in the page pool (400)."""
        try:
            asked = completion_request(self.model, self.served_name, parse_json(body), self.capacity)
        except APIError:
            raise
        except MinigptError as e:  # a check that is not the API's own (the tokenizer's)
            raise library_error(e, 1) from None
        try:
            candidates = list(asked.candidates())
            jobs = self.engine.jobs_for(candidates, [asked.prompt_logprobs] * len(candidates))
        except InputError as e:  # about the pool's size (--kv-cache-tokens): the prompt is what the client can change
            e.prompt //= asked.best_of  # candidate j of prompt i is candidate i * best_of + j
            raise APIError(library_error(e, len(asked.requests)).message(), "prompt",
                           "context_length_exceeded") from None
        return asked, jobs

    def arrived(self, updates: asyncio.Queue, update: Update) -> None:
        """On the event loop: an Update from the engine thread."""
        if update.final:
            self.in_flight -= 1
        updates.put_nowait(update)

    async def whole(self, request: HTTPRequest, identity: str, asked: CompletionRequest, tickets: list[Ticket],
                    updates: asyncio.Queue) -> Response:
        """Wait for every choice, then answer at once; a client that leaves first cancels them."""
        results: dict[int, GenerationResult] = {}
        gone = asyncio.ensure_future(disconnected(request))
        try:
            while len(results) < len(tickets):
                got = asyncio.ensure_future(updates.get())
                await asyncio.wait([got, gone], return_when=asyncio.FIRST_COMPLETED)
                if not got.done():
                    got.cancel()
                    self.engine_thread.cancel(tickets)
                    return Response(status_code=499)  # nginx's "client closed request": nobody reads it
                update = got.result()
                if update.error is not None:
                    self.engine_thread.cancel(tickets)
                    return error_response(update.error)
                if update.final:
                    results[update.index] = update.result
        finally:
            gone.cancel()
        ordered = [results[i] for i in range(len(tickets))]
        tokenizer = self.model.tokenizer
        body = envelope(identity, self.served_name, [choice_json(tokenizer, asked, i, r)
                                                     for i, r in enumerate(asked.choices(ordered))])
        body["usage"] = usage_json(asked, ordered)
        return JSONResponse(body)

    async def events(self, identity: str, asked: CompletionRequest, tickets: list[Ticket], updates: asyncio.Queue):
        """Server-sent events: a chunk per choice as its tokens are released, then the usage (if asked)
        and [DONE]. Starlette cancels this when the client leaves: its choices are cancelled then."""
        streams = [ChoiceStream(self.model.tokenizer, asked, i) for i in range(len(tickets))]
        results: dict[int, GenerationResult] = {}
        echoed: set[int] = set()
        created = envelope(identity, self.served_name, [])["created"]

        def event(choices: list[dict], **extra) -> str:
            chunk = {**envelope(identity, self.served_name, choices, created), **extra}
            if asked.include_usage and "usage" not in extra:
                chunk["usage"] = None
            return f"data: {json.dumps(chunk)}\n\n"

        try:
            while len(results) < len(tickets):
                update = await updates.get()
                if update.error is not None:
                    self.engine_thread.cancel(tickets)
                    yield f"data: {json.dumps(update.error.body())}\n\n"
                    break
                stream = streams[update.index]
                if asked.echo and update.index not in echoed:  # its first Update carries the prompt's scores
                    echoed.add(update.index)
                    yield event([stream.echo(update.result)])
                if update.records or update.final:
                    yield event([stream.chunk(update.records, update.result if update.final else None)])
                if update.final:
                    results[update.index] = update.result
            else:
                if asked.include_usage:
                    yield event([], usage=usage_json(asked, [results[i] for i in range(len(tickets))]))
            yield "data: [DONE]\n\n"
        finally:
            if len(results) < len(tickets):
                self.engine_thread.cancel(tickets)


async def disconnected(request: HTTPRequest) -> None:
    """Returns when the client has gone (the body already read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def read_body(request: HTTPRequest) -> bytes:
    """The body, refused (413) as soon as it passes MAX_BODY_BYTES, whatever Content-Length says."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large()
    body = bytearray()
    try:
        async with asyncio.timeout(BODY_SECONDS):
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_BODY_BYTES:
                    raise too_large()
    except ClientDisconnect:
        raise APIError("the client left before sending the whole body") from None
    except TimeoutError:
        raise APIError(f"the body did not arrive within {BODY_SECONDS} s", None, "request_timeout", 408) from None
    return bytes(body)


def too_large() -> APIError:
    return APIError(f"the body is larger than {MAX_BODY_BYTES:,} bytes", None, "body_too_large", 413)


def error_response(error: APIError) -> Response:
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if error.status == 429 else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def check_ids_field(tokens, vocab_size: int) -> list[int]:
    """A JSON list of token ids, checked by the library (check_ids)."""
    if not isinstance(tokens, list):
        raise InputError("must be a list of token ids")
    return check_ids(tokens, vocab_size).tolist()
