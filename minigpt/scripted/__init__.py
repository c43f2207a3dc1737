"""Part 7, scripted use: the public functions, scoring and the OpenAI-compatible server
(docs/api.md, docs/serving.md); the command line is minigpt.cli.

Modules, in reading order:
    scoring              the log-likelihood of a given text, in windows for long ones
    api                  generate, stream, generate_batch, score, prove, inspect: checked, then run
    completion_request   OpenAI's completions request: a body checked into one CompletionRequest
    completion_response  its answer: results shaped into OpenAI's JSON, whole or streamed
    metrics              /metrics: the engine's state in Prometheus' text format, vLLM's names
    engine_thread        the one thread that drives a shared Engine while requests come and go
    page                 the page that watches it run (`/`), and /inspect, one head's attention
    serve                the HTTP routes: bodies checked, choices handed to the engine thread, answers streamed
    http_server          uvicorn on a bound socket: a deadline on headers, a shutdown that answers the running
"""
