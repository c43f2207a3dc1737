"""Part 7, scripted use: the public functions, scoring and the OpenAI-compatible server
(docs/api.md, docs/serving.md); the command line is minigpt.cli.

Modules, in reading order:
    scoring        the log-likelihood of a given text, in windows for long ones
    api            generate, stream, generate_batch, Engine, score, prove, inspect: checked, then run
    completions    OpenAI's completions API: a body checked into requests, results into its JSON
    engine_thread  the one thread that drives a shared Engine while requests come and go
    serve          the HTTP server: bodies checked, choices handed to the engine thread, answers streamed
"""
