"""minigpt: GPT-2 inference written from scratch in NumPy, with a KV cache that is bitwise exact.

    import minigpt
    model = minigpt.load("gpt2")                      # or a directory, a hub id, "random-124m"
    ids = minigpt.encode(model.tokenizer, "The dog")
    result = minigpt.generate(model, ids, max_new_tokens=20)
    print(result.text)
    results = minigpt.generate_batch(model, [ids, ids[:1]], max_new_tokens=20)   # together, each as if alone
    logprobs = minigpt.score(model, ids)             # log P(ids[i] | ids[:i]) for i >= 1

The packages are the book's parts, read in this order (docs/README.md follows it); each package's
docstring lists its modules in reading order:

    errors    0. one exception hierarchy, and the checks of plain values every boundary makes
    gpt2      1. GPT-2, plainly
    cache     2. the KV cache
    loop      3. the loop and what it costs
    exact     4. new: exactness
    loading   5. loading and checking: checkpoints, the tokenizer, Model
    requests  6. a request's options, constraints and checks, into one Request
    engine    7. the engine
    api       8. the Python API: generate, score, inspect
    server    9. the OpenAI-compatible server, its metrics and page
    cli      10. `python -m minigpt ...`, one module per command
    testing  11. the claims as tools for a reader's own code (needs Hypothesis)

The names below are imported on first use, so `import minigpt`
loads nothing else and changes no process state.
"""

import importlib

_EXPORTS = {  # name -> the module that defines it
    "GPT2Config": "gpt2.config", "KVCache": "cache.kv_cache", "GenerationResult": "loop.sequence",
    "StreamedToken": "loop.sequence", "Model": "loading.model", "encode": "loading.tokenizer",
    "gpt2_tokenizer": "loading.tokenizer", "load": "loading.loader", "generate": "api.api",
    "stream": "api.api", "generate_batch": "api.api", "Engine": "engine.engine", "score": "api.api",
    "prove": "api.api", "inspect": "api.api",
    "MinigptError": "errors",
}
__all__ = [*_EXPORTS, "errors"]


def __getattr__(name: str):
    if name == "errors":
        return importlib.import_module(".errors", __name__)
    if name not in _EXPORTS:
        raise AttributeError(f"module 'minigpt' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
