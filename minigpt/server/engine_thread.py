"""The engine thread: the one thread that drives a shared Engine while requests come and go.

An Engine is driven from one thread at a time, and a server's requests arrive on others: requests
are handed to this thread as Tickets through a deque; it submits them, cancels those whose client
left, runs `step()` in a loop, and hands each choice that progressed an Update (new tokens, or its
result). A choice that fails, fails alone; the loop goes on (docs/serving.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from .completion_request import APIError, library_error
from .completion_response import FINISH_REASONS
from .metrics import Metrics
from ..engine.engine import Engine, failure
from ..engine.job import Job
from ..errors import NumericalError
from ..loop.sequence import GenerationResult, StreamedToken

log = logging.getLogger("minigpt.server.engine_thread")
IDLE_POLL_SECONDS = 0.5  # an idle engine thread wakes this often to see whether it should stop
PREPARING = 40  # requests prepared at once (each on a thread), as many as Starlette's worker threads


@dataclass
class Update:
    """What the engine thread tells a choice after a step: tokens released since the last Update,
    a snapshot of its result (with its first Update, for echo, and with its last), or an error."""

    index: int
    records: list[StreamedToken]
    result: GenerationResult | None = None
    final: bool = False
    error: APIError | None = None


@dataclass(eq=False)
class Ticket:
    """One choice on its way through the engine thread: its job (Engine.jobs_for's, checked to fit,
    not yet queued). `deliver` is called from that thread."""

    job: Job
    deliver: Callable[[Update], None]
    cancelled: bool = False
    # the fields below: the engine thread's alone
    sent: int = 0  # tokens already delivered
    started: bool = False
    arrived: float = 0.0  # time.monotonic() when the engine thread took it
    counted: int = 0  # tokens already counted in the metrics
    prefill_counted: bool = False  # its prompt counted in the metrics
    last: float = 0.0  # when the last of them was


class EngineThread:
    """The one thread that runs the Engine: tickets in through a deque, Updates out through callbacks."""

    def __init__(self, engine: Engine, metrics: Metrics):
        self.engine, self.metrics = engine, metrics
        self.incoming: deque[Ticket] = deque()
        self.tickets: dict[Job, Ticket] = {}
        self.wake = threading.Event()
        self.stopping = False
        self.aborted: APIError | None = None  # set: every choice in flight or coming ends with this error
        self.thread = threading.Thread(target=self.loop, name="minigpt-engine", daemon=True)

    def submit(self, tickets: list[Ticket]) -> None:
        """Hand choices to the engine (any thread)."""
        self.incoming.extend(tickets)
        self.wake.set()

    def cancel(self, tickets: list[Ticket]) -> None:
        """Stop choices whose client left (any thread); their pages go back to the pool at the next step."""
        for ticket in tickets:
            ticket.cancelled = True
        self.wake.set()

    def abort(self, error: APIError) -> None:
        """End every choice in flight, and any handed over later, with `error` (any thread)."""
        self.aborted = error
        self.wake.set()

    def stop(self) -> None:
        """Cancel whatever is left, free its pages and end the thread."""
        self.stopping = True
        self.wake.set()
        self.thread.join()

    def loop(self) -> None:
        while True:
            self.wake.clear()
            self.take_incoming()
            for ticket in self.tickets.values():
                if ticket.cancelled or self.stopping or self.aborted:
                    self.engine.cancel(ticket.job)
            if not self.tickets and not self.incoming and not self.engine.pending():
                if self.stopping:
                    return
                self.wake.wait(IDLE_POLL_SECONDS)
                continue
            self.step()

    def take_incoming(self) -> None:
        while self.incoming:
            ticket = self.incoming.popleft()
            ticket.arrived = time.monotonic()
            self.engine.submit([ticket.job])
            self.tickets[ticket.job] = ticket

    def step(self) -> None:
        """One engine step, then an Update for every choice that progressed or finished. An error
        fails the choices of the step (500) and cancels them; the engine goes on."""
        finished: list[Job] = []
        try:
            finished, _ = self.engine.step()  # an overflow is its choice's NumericalError (Engine.step)
            self.metrics.stepped()
            self.updates(finished)
        except Exception as e:  # a fault of minigpt's, never of the request: logged, and the loop goes on
            log.exception("an engine step failed; its requests are answered with a 500")
            message = APIError(f"internal error in the engine step: {type(e).__name__}: {e}", None,
                               "internal_error", 500, "server_error")
            self.finish([job for job in self.tickets if job.finished])  # ended before the fault: answered
            ran = self.engine.in_batch() or self.engine.queued()  # those it ran, or tried to admit
            for job in [*finished, *ran]:
                if job in self.tickets:
                    self.engine.cancel(job)
                    self.metrics.ended("error")
                    self.tickets.pop(job).deliver(Update(job.index, [], final=True, error=message))

    def finish(self, finished: list[Job]) -> None:
        """Every finished choice its last Update: its result, or why it was cancelled before its end."""
        for job in finished:
            ticket = self.tickets.pop(job, None)
            if ticket is None:
                continue
            self.count(job, ticket)
            result = job.result()
            self.metrics.ended("error" if job.error is not None else FINISH_REASONS.get(result.finish_reason, "abort"))
            if job.error is not None:  # its weights overflowed or its processing gave up: this choice alone fails
                ticket.deliver(Update(job.index, [], final=True, error=self.failed(job)))
            elif result.finish_reason != "abort":
                ticket.deliver(Update(job.index, job.seq.streamed(ticket.sent), result, final=True))
            else:  # nobody reads a client's that left; a shutdown's is answered
                ticket.deliver(Update(job.index, [], final=True, error=self.aborted or APIError(
                    "cancelled: the client left", None, "cancelled", 499)))

    def failed(self, job: Job) -> APIError:
        """The answer of a choice that could not go on: an overflow of the weights on its ids is a 500
        naming the layer where it began, a processing that gave up a 400 (library_error)."""
        error = failure(self.engine.gpt, job)
        if not isinstance(error, NumericalError):
            return library_error(error, 1)
        log.warning("choice %s: the activations stopped being finite", job.index)
        return APIError(f"choice {job.index}: {error.message()}", None, "numerical_error", 500, "server_error")

    def updates(self, finished: list[Job]) -> None:
        """Every finished choice its last Update; every running one that released tokens (or was just
        prefilled: echo needs its prompt's scores) an Update."""
        self.finish(finished)
        for job in self.engine.in_batch():
            ticket = self.tickets.get(job)
            if ticket is None:  # failed in an earlier step: leaving at the next
                continue
            self.count(job, ticket)
            records = job.seq.streamed(ticket.sent)
            first = not ticket.started and job.prefilled
            if records or first:
                ticket.sent += len(records)
                ticket.started = True
                ticket.deliver(Update(job.index, records, job.result() if first else None))

    def count(self, job: Job, ticket: Ticket) -> None:
        """The metrics of a choice's prompt once it is computed, and of the tokens it made since it
        was last counted."""
        made = len(job.seq.tokens) - ticket.counted
        if not ticket.prefill_counted and (job.prefilled or made > 0):
            self.metrics.prefilled(len(job.seq.request.prompt), job.cached_tokens)
            ticket.prefill_counted = True
        if made <= 0:
            return
        now = time.monotonic()
        if not ticket.counted:
            self.metrics.first_token(ticket.arrived)
        self.metrics.tokens(made, now - ticket.last if ticket.counted else 0.0)
        ticket.counted, ticket.last = len(job.seq.tokens), now


def shutting_down() -> APIError:
    return APIError("the server is shutting down", None, "shutting_down", 503, "server_error")


class Preparation:
    """What the HTTP side does before a request reaches the engine thread (a body checked, a
    constraint compiled, /inspect's forward), off the event loop, each on a daemon thread, at most
    PREPARING at once; once the server stops, one not done is answered 503 and left unread."""

    def __init__(self):
        self.stopped = asyncio.Event()
        self.places = asyncio.Semaphore(PREPARING)

    def stop(self) -> None:
        """Answer every preparation not done, and any begun later, 503 (on the event loop)."""
        self.stopped.set()

    async def run(self, work: Callable, *args):
        """work(*args) on a thread of its own; its result, or its exception raised here."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def run() -> None:
            try:
                outcome = (work(*args), None)
            except Exception as e:  # raised again on the event loop
                outcome = (None, e)
            with contextlib.suppress(RuntimeError):  # the loop closed first: nobody is waiting
                loop.call_soon_threadsafe(lambda: done.done() or done.set_result(outcome))

        async with self.places:
            threading.Thread(target=run, name="minigpt-prepare", daemon=True).start()
            stop = asyncio.ensure_future(self.stopped.wait())
            try:
                await asyncio.wait([done, stop], return_when=asyncio.FIRST_COMPLETED)
            finally:
                stop.cancel()
            if not done.done():
                raise shutting_down()
        result, error = done.result()
        if error is not None:
            raise error
        return result
