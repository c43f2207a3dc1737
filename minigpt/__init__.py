"""minigpt: GPT-2 inference written from scratch in NumPy, with a KV cache that is bitwise exact.

    import minigpt
    model = minigpt.load("gpt2")                      # or a directory, a hub id, "random-124m"
    ids = minigpt.encode(model.tokenizer, "The dog")
    result = minigpt.generate(model, ids, max_new_tokens=20)
    print(model.tokenizer.decode(result.tokens))
    results = minigpt.generate_batch(model, [ids, ids[:1]], max_new_tokens=20)   # together, each as if alone
    logprobs = minigpt.score(model, ids)             # log P(ids[i] | ids[:i]) for i >= 1

The modules, bottom to top, are the chapters: errors, files, kernels, config, params, kv_cache, layers,
paging, tokenizer, safetensors_format, checkpoint, model, loading, sampling, sequence, speculative,
generate, scoring, batching, causal_proof, cost, staircase, cli.
"""

import os
import signal
import sys

if sys.argv[:1] == ["-m"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    # `python -m minigpt` is starting (Python sets argv[0] to "-m" while it imports the package): Ctrl-C
    # while the modules below load exits 130 at once, with no traceback (nothing is printed yet);
    # minigpt/__main__.py restores KeyboardInterrupt once they are loaded.
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))

from . import errors
from .batching import generate_batch
from .config import GPT2Config
from .errors import MinigptError
from .generate import generate, stream
from .kv_cache import KVCache, new_cache
from .loading import load
from .model import Model, Trace, forward
from .scoring import score
from .sequence import GenerationResult, StreamedToken
from .tokenizer import encode, gpt2_tokenizer

__all__ = ["GPT2Config", "GenerationResult", "KVCache", "MinigptError", "Model", "StreamedToken", "Trace", "encode",
           "errors", "forward", "generate", "generate_batch", "gpt2_tokenizer", "load", "new_cache", "score", "stream"]
