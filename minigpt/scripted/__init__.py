"""Part 7, scripted use: the public functions, scoring and the OpenAI-compatible server
(docs/api.md, docs/serving.md); the command line is minigpt.cli.

Modules, in reading order:
    scoring      the log-likelihood of a given text, in windows for long ones
    api          generate, stream, generate_batch, Engine, score, prove: checked, then run
    completions  OpenAI's completions API: a body checked into requests, results into its JSON
    serve        the HTTP server on one engine thread
"""
