"""The HTTP server's plumbing: uvicorn run on a bound socket for minigpt.server.serve's routes, with
a deadline on a connection's headers and a shutdown that answers the requests still running."""

from __future__ import annotations

import contextlib
import socket
import sys

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from .serve import SHUTDOWN_GRACE_SECONDS, Service
from ..errors import InputError

HEADER_SECONDS = 10  # a connection's request line and headers must arrive within this of it opening or being idle


class HeaderTimeoutProtocol(H11Protocol):
    """uvicorn's HTTP/1.1, closing a connection whose request line and headers have not all arrived
    HEADER_SECONDS after it opened or after its last response: an idle or half-sent connection holds
    a socket forever otherwise."""

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self.deadline = self.loop.call_later(HEADER_SECONDS, self.late)

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and not self.cycle.response_complete:
            self.deadline.cancel()  # a request is being answered

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self.deadline.cancel()
        self.deadline = self.loop.call_later(HEADER_SECONDS, self.late)

    def connection_lost(self, exc) -> None:
        self.deadline.cancel()
        super().connection_lost(exc)

    def late(self) -> None:
        if self.cycle is None or self.cycle.response_complete:
            self.transport.close()


class ServiceServer(uvicorn.Server):
    """uvicorn's server, saying where it listens once it does (its signal handlers in place by then),
    ending its requests in OpenAI's shape when it stops, and ending normally (exit status 0) on
    SIGINT or SIGTERM: uvicorn would raise the signal again once it has shut down."""

    def __init__(self, config: uvicorn.Config, service: Service):
        super().__init__(config)
        self.service = service

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.service.shutting_down()
        await super().shutdown(sockets)

    @contextlib.contextmanager
    def capture_signals(self):
        with super().capture_signals():
            yield
            self._captured_signals.clear()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        for sock in sockets or []:
            print(f"minigpt serve: listening on {url(*sock.getsockname()[:2])} (Ctrl-C stops)", file=sys.stderr,
                  flush=True)


def url(host: str, port: int) -> str:
    """The URL of a listening address: an IPv6 address in brackets, as a URL writes it."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port) on an IPv4 or IPv6 address or a host name, bound
    before the model's first request."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        return socket.create_server((host, port), family=family)
    except (OSError, UnicodeError) as e:
        raise InputError(f"cannot listen on {host}:{port}: {getattr(e, 'strerror', None) or e}") from None


def server(service: Service) -> ServiceServer:
    """A uvicorn server for the service's app, quiet but for warnings and errors (no access log)."""
    config = uvicorn.Config(service.app(), http=HeaderTimeoutProtocol, log_level="warning", access_log=False,
                            lifespan="on", timeout_graceful_shutdown=SHUTDOWN_GRACE_SECONDS + 2)  # ours answers first
    return ServiceServer(config, service)


def serve(service: Service, sock: socket.socket) -> None:
    """Serve on `sock` until SIGINT or SIGTERM: then stop accepting, give running requests
    SHUTDOWN_GRACE_SECONDS to finish, answer the rest 503 (streams: an error event and [DONE]) and return."""
    server(service).run(sockets=[sock])
