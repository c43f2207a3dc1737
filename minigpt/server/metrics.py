"""`/metrics`: the server's engine in Prometheus' text format, with prometheus_client (the client vLLM
uses) and vLLM's metric names under a `minigpt:` prefix, each labelled with the served model's name.

Gauges are read from the Engine when scraped; counters and histograms are fed by the engine thread
as choices progress (docs/serving.md lists them).
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..engine.engine import Engine

# vLLM's buckets for the time to first token and between tokens, in seconds
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                40.0, 80.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
               80.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    """One engine's metrics, in a registry of their own (several servers in one process stay apart)."""

    CONTENT_TYPE = CONTENT_TYPE

    def __init__(self, engine: Engine, served_name: str):
        self.registry = registry = CollectorRegistry()
        self.engine, self.label, label = engine, served_name, {"model_name": served_name}

        def gauge(name: str, doc: str, read, states: tuple[str, ...] = ()) -> None:
            """A gauge read when scraped: read() alone, or read(state) for each of its states."""
            g = Gauge(f"minigpt:{name}", doc, [*label, *(["state"] if states else [])], registry=registry)
            if not states:
                g.labels(**label).set_function(read)
            for state in states:
                g.labels(**label, state=state).set_function(lambda state=state: read(state))

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"minigpt:{name}", doc, list(label), registry=registry).labels(**label)

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return Histogram(f"minigpt:{name}", doc, list(label), buckets=buckets, registry=registry).labels(**label)

        gauge("num_requests_running", "Choices in the running batch.", lambda: len(engine.in_batch()))
        gauge("num_requests_waiting", "Choices waiting for a place or for pages.", lambda: len(engine.queued()))
        gauge("kv_cache_usage_perc", "Fraction of the KV page pool held by running sequences (0-1).",
              lambda: engine.stats()["pages_in_use"] / engine.stats()["pages_total"])
        gauge("kv_cache_pages", "Pages of the KV pool: held by running sequences, kept by the prefix cache with "
              "nobody holding them, free.", lambda state: engine.stats()[f"pages_{state}"], ("in_use", "cached", "free"))
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of the choices prefilled.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.preemptions = counter("num_preemptions", "Sequences preempted (their pages given back, recomputed later).")
        self.finished = Counter("minigpt:request_success", "Choices finished, by reason: stop (end of text or a "
                                "stop string), length, abort (cancelled: the client left, or the server stopped), "
                                "error.", [*label, "finished_reason"], registry=registry)
        self.ttft = histogram("time_to_first_token_seconds", "From a choice's arrival at the engine thread to its "
                              "first token.", TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Between consecutive tokens of a choice.", ITL_BUCKETS)
        self.seen_preemptions = 0

    def prefilled(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A choice's prompt was computed (and scored, if asked), whether or not it then made a token
        (an echo with max_tokens 0 makes none) (the engine thread)."""
        self.prompt_tokens.inc(prompt_tokens)
        self.prefix_queries.inc(prompt_tokens)
        self.prefix_hits.inc(cached_tokens)

    def first_token(self, arrived: float) -> None:
        """A choice made its first token (the engine thread)."""
        self.ttft.observe(time.monotonic() - arrived)

    def tokens(self, n: int, since: float) -> None:
        """A choice released n tokens, the first of them `since` after its last (the engine thread)."""
        self.generation_tokens.inc(n)
        if since:
            self.itl.observe(since)

    def ended(self, reason: str) -> None:
        """A choice ended (the engine thread): a finish reason of the API's, "abort" or "error"."""
        self.finished.labels(model_name=self.label, finished_reason=reason).inc()

    def stepped(self) -> None:
        """After an engine step: preemptions counted from the engine's own count."""
        total = self.engine.stats()["preemptions"]
        self.preemptions.inc(total - self.seen_preemptions)
        self.seen_preemptions = total

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
