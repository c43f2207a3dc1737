"""Part 8, the Python API: the public functions a script calls, scoring a given text, and one forward
kept for a reader (docs/api.md); the server is minigpt.server, the command line minigpt.cli.

Modules, in reading order:
    scoring     the log-likelihood of a given text, in windows for long ones
    inspection  one forward kept for a reader: attention per head, the residual stream, the logit lens
    api         generate, stream, generate_batch, score, prove, inspect: checked, then run
"""
