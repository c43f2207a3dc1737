"""`serve`: OpenAI's completions API on 127.0.0.1 (by default), every answer bitwise its solo generation.

The server itself is minigpt.scripted.serve; this module parses the options, loads the model, binds the
port and runs it until SIGINT or SIGTERM (exit 0).
"""

from __future__ import annotations

import argparse
import logging

from ..scripted.api import Engine
from ..errors import MinigptError
from .common import add_model_options, checked, load_model, non_negative_int, positive_int

DEFAULT_MAX_BATCH_SIZE, DEFAULT_MAX_QUEUE = 16, 256
port = checked(int, lambda v: 0 <= v <= 65535, "in 0..65535")


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve OpenAI's completions API over HTTP",
                       description="Serve /v1/completions (and /v1/models, /health, /tokenize, /detokenize, "
                                   "/tokenizer_info) on one engine that batches every request continuously. With "
                                   "the exact kernels every answer is bitwise what `generate` gives it alone "
                                   "(docs/serving.md). Needs the serve extra: pip install 'minigpt[serve]'.")
    add_model_options(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=port, default=8000, help="the port (default 8000; 0: any free port)")
    p.add_argument("--max-batch-size", type=positive_int, default=DEFAULT_MAX_BATCH_SIZE, metavar="B",
                   help=f"decode at most B sequences together (default {DEFAULT_MAX_BATCH_SIZE})")
    p.add_argument("--kv-cache-tokens", type=positive_int, default=None, metavar="T",
                   help="the pool of keys and values holds T positions, in pages of 16 (default: B whole contexts)")
    p.add_argument("--max-queue", type=non_negative_int, default=DEFAULT_MAX_QUEUE, metavar="N",
                   help=f"at most N choices wait beyond the B running; more is a 429 (default {DEFAULT_MAX_QUEUE})")
    p.add_argument("--served-model-name", metavar="NAME",
                   help="the name clients give as `model` (default: --model's value)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        from ..scripted import serve
    except ImportError as e:
        raise MinigptError(f"serve needs the serve extra ({e.name} is not installed): "
                           "pip install 'minigpt[serve]'") from None
    sock = serve.bind(args.host, args.port)  # before loading: a port in use fails at once
    with sock:
        model = load_model(args)
        engine = Engine(model, max_batch_size=args.max_batch_size, kv_cache_tokens=args.kv_cache_tokens)
        logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s: %(message)s")
        serve.serve(serve.Service(model, engine, args.served_model_name or args.model, args.max_queue), sock)
    return 0
