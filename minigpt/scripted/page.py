"""The page that watches the server run (`/`: plain HTML, CSS and JavaScript shipped in the package,
no build step and nothing fetched from elsewhere), and the endpoints it reads besides the API:
`/metrics` (minigpt.scripted.metrics) and `/inspect`, one layer and head of minigpt.inspect's attention
(docs/serving.md)."""

from __future__ import annotations

from importlib.resources import files

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from ..errors import MinigptError
from .api import inspect
from .completions import APIError

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

    async def attention(request: HTTPRequest) -> Response:
        """{"tokens": ids, "layer": L, "head": H} -> {"layer", "head", "attention": [T][T]}: row t is
        query t's weights over keys 0 .. T-1 in that layer and head."""
        async def answer(body: dict) -> Response:
            service.check_fields(body, ("model", "tokens", "layer", "head"))
            config = service.model.config
            for field, limit in (("layer", config.n_layer), ("head", config.n_head)):
                value = body.get(field)
                if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < limit:
                    raise APIError(f"{field} must be an integer in 0..{limit - 1}", field)
            try:
                found = await service.preparation.run(inspect, service.model, body.get("tokens"))
            except APIError:  # the server stopped first (503)
                raise
            except MinigptError as e:
                raise APIError(f"tokens: {e}", "tokens") from None
            return JSONResponse({"layer": body["layer"], "head": body["head"],
                                 "attention": found.attention[body["layer"], body["head"]].tolist()})
        return await service.checked(request, answer)

    return [*(Route(path, static(path)) for path in STATIC), Route("/metrics", metrics),
            Route("/inspect", attention, methods=["POST"])]
