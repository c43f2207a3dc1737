"""minigpt: GPT-2 inference written from scratch in NumPy, with a KV cache that is bitwise exact.

    import minigpt
    model = minigpt.load("gpt2")                      # or a directory, a hub id, "random-124m"
    ids = minigpt.encode(model.tokenizer, "The dog")
    result = minigpt.generate(model, ids, max_new_tokens=20)
    print(model.tokenizer.decode(result.tokens))
    results = minigpt.generate_batch(model, [ids, ids[:1]], max_new_tokens=20)   # together, each as if alone
    logprobs = minigpt.score(model, ids)             # log P(ids[i] | ids[:i]) for i >= 1

The modules are the chapters; read them in the order of the README's table (docs/README.md
follows it): GPT-2 plainly, the KV cache, the loop and its cost, exactness, the engine, loading
and checking, scripted use. The names below are imported on first use, so `import minigpt`
loads nothing else and changes no process state.
"""

import importlib

_EXPORTS = {  # name -> the module that defines it
    "GPT2Config": "config", "KVCache": "kv_cache", "GenerationResult": "sequence", "StreamedToken": "sequence",
    "Model": "model", "encode": "tokenizer", "gpt2_tokenizer": "tokenizer", "load": "loading",
    "generate": "api", "stream": "api", "generate_batch": "api", "Engine": "api", "score": "api", "prove": "api",
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
