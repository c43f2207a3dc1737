"""The sections of scripts/benchmark.py, one module each (decode, batching, paging, speculative), and
what they share (common). Each section module has TITLE, DOC (its chapter in docs/), BLOCK (its
markers' name) and run() -> common.Report."""
