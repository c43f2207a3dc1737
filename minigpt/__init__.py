"""minigpt: GPT-2 inference written from scratch in NumPy, with a KV cache that is bitwise exact.

    import minigpt
    model = minigpt.load("gpt2")                      # or a directory, a hub id, "random-124m"
    ids = minigpt.encode(model.tokenizer, "The dog")
    result = minigpt.generate(model, ids, max_new_tokens=20)
    print(model.tokenizer.decode(result.tokens))

The modules, bottom to top, are the chapters: errors, kernels, config, params, layers, kv_cache,
tokenizer, safetensors_format, checkpoint, model, loading, sampling, generate, causal_proof,
cost, staircase, cli.
"""

from . import errors
from .config import GPT2Config
from .errors import MinigptError
from .generate import GenerationResult, generate, stream
from .kv_cache import KVCache, new_cache
from .loading import load
from .model import Model, Trace, forward
from .tokenizer import encode, gpt2_tokenizer

__all__ = ["GPT2Config", "GenerationResult", "KVCache", "MinigptError", "Model", "Trace", "encode",
           "errors", "forward", "generate", "gpt2_tokenizer", "load", "new_cache", "stream"]
