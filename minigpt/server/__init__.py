"""Part 9, the server: an OpenAI-compatible HTTP server on one shared Engine, its metrics and the page
that watches it run (docs/serving.md).

Modules, in reading order:
    completion_request   OpenAI's completions request: a body checked into one CompletionRequest
    completion_response  its answer: results shaped into OpenAI's JSON, whole or streamed
    metrics              /metrics: the engine's state in Prometheus' text format, vLLM's names
    engine_thread        the one thread that drives a shared Engine while requests come and go
    page                 the page that watches it run (`/`), and /inspect, one head's attention
    serve                the HTTP routes: bodies checked, choices handed to the engine thread, answers streamed
    http_server          uvicorn on a bound socket: a deadline on headers, a shutdown that answers the running
"""
