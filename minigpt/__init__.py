"""minigpt: GPT-2 inference written from scratch in NumPy, with a KV cache that is bitwise exact.

    import minigpt
    model = minigpt.load("gpt2")                      # or a directory, a hub id, "random-124m"
    ids = minigpt.encode(model.tokenizer, "The dog")
    result = minigpt.generate(model, ids, max_new_tokens=20)
    print(result.text)
    results = minigpt.generate_batch(model, [ids, ids[:1]], max_new_tokens=20)   # together, each as if alone
    logprobs = minigpt.score(model, ids)             # log P(ids[i] | ids[:i]) for i >= 1

The modules are the chapters; read them in this order (the README's table and docs/README.md follow it):

1. the model: config, params, layers (a linear map is x @ w.T + b, kernels.fast_linear), model, tokenizer;
2. the loop: generate, sampling, sequence; what it costs: cost, staircase;
3. the cache: kv_cache, and causal_proof, the proof that it is exact;
4. new, exactness: kernels, the row-invariant EXACT kernels that make the proof hold bit for bit;
5. the other fixes: batching, paging, speculative;
6. scripted use: scoring, cli;
7. loading and checking: loading, checkpoint, safetensors_format, errors, files.
"""

import os
import signal
import sys

if sys.argv[:1] == ["-m"] and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    # `python -m minigpt` is starting (Python sets argv[0] to "-m" while it imports the package): Ctrl-C
    # while the modules below load exits 130 at once, with no traceback (nothing is printed yet);
    # minigpt/__main__.py restores KeyboardInterrupt once they are loaded.
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(130))

from .config import GPT2Config
from .model import Model, Trace, forward
from .tokenizer import encode, gpt2_tokenizer
from .generate import generate, stream
from .sequence import GenerationResult, StreamedToken
from .kv_cache import KVCache, new_cache
from .batching import generate_batch
from .scoring import score
from .loading import load
from . import errors
from .errors import MinigptError

__all__ = ["GPT2Config", "Model", "Trace", "forward", "encode", "gpt2_tokenizer", "generate", "stream",
           "GenerationResult", "StreamedToken", "KVCache", "new_cache", "generate_batch", "score", "load",
           "errors", "MinigptError"]
