"""The page that watches the server run (`/`: plain HTML, CSS and JavaScript shipped in the package,
no build step and nothing fetched from elsewhere), and the endpoints it reads besides the API:
`/metrics` (minigpt.server.metrics) and `/inspect`, one layer and head of minigpt.inspect's attention,
computed one request at a time for at most INSPECT_TOKENS ids (docs/serving.md)."""

from __future__ import annotations

import json
import threading
from importlib.resources import files

from starlette.requests import Request as HTTPRequest
from starlette.responses import Response
from starlette.routing import Route

from ..errors import MinigptError
from ..api.api import head_attention
from .completion_request import APIError

INSPECT_IN_FLIGHT = 4  # /inspect requests held at once, computing or waiting for their turn; more are a 429
STATIC = {"/": ("index.html", "text/html; charset=utf-8"), "/page.js": ("page.js", "text/javascript; charset=utf-8"),
          "/page.css": ("page.css", "text/css; charset=utf-8")}


def routes(service) -> list[Route]:
    """The page's routes on a serve.Service."""
    def static(path: str):
        name, media = STATIC[path]
        content = (files(__package__) / "page" / name).read_bytes()

        async def answer(request: HTTPRequest) -> Response:
            return Response(content, media_type=media)
        return answer

    async def metrics(request: HTTPRequest) -> Response:
        return Response(service.metrics.exposition(), media_type=service.metrics.CONTENT_TYPE)

    turn = threading.BoundedSemaphore(1)  # one /inspect computes at a time, in a worker thread
    in_flight = [0]  # /inspect requests computing or waiting for their turn (the event loop's alone)

    async def attention(request: HTTPRequest) -> Response:
        """{"tokens": ids, "layer": L, "head": H} -> {"layer", "head", "attention": [T][T]}: row t is
        query t's weights over keys 0 .. T-1 in that layer and head. One computes at a time, at most
        INSPECT_IN_FLIGHT are held (then a 429): memory stays within one request's, bounded by INSPECT_TOKENS."""
        async def answer(body: dict) -> Response:
            service.check_fields(body, ("model", "tokens", "layer", "head"))
            config = service.model.config
            for field, limit in (("layer", config.n_layer), ("head", config.n_head)):
                value = body.get(field)
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < limit:
                    raise APIError(f"{field} must be an integer in 0..{limit - 1}", field)
            if in_flight[0] >= INSPECT_IN_FLIGHT:
                raise APIError(f"the server is busy: {INSPECT_IN_FLIGHT} /inspect requests are in flight; retry "
                               "later", None, "queue_full", 429, "rate_limit_error")
            in_flight[0] += 1
            try:
                content = await service.preparation.run(one_at_a_time, turn, inspected, service.model, body)
            except APIError:  # the server stopped first (503)
                raise
            except MinigptError as e:
                raise APIError(f"tokens: {e}", "tokens") from None
            finally:
                in_flight[0] -= 1
            return Response(content, media_type="application/json")
        return await service.answer_json_body(request, answer)

    return [*(Route(path, static(path)) for path in STATIC), Route("/metrics", metrics),
            Route("/inspect", attention, methods=["POST"])]


def one_at_a_time(turn: threading.BoundedSemaphore, function, *args):
    """function(*args) at its turn (in a worker thread: the event loop never waits)."""
    with turn:
        return function(*args)


def inspected(model, body: dict) -> bytes:
    """/inspect's answer to a body whose layer and head are checked, as JSON (T^2 numbers: built off
    the event loop)."""
    weights = head_attention(model, body.get("tokens"), body["layer"], body["head"])  # [T, T]
    return json.dumps({"layer": body["layer"], "head": body["head"], "attention": weights.tolist()},
                      separators=(",", ":")).encode()
