"""`serve`: OpenAI's completions API on 127.0.0.1 (by default), every answer bitwise its solo generation.
The options parsed, the model loaded, minigpt.server.serve runs until SIGINT or SIGTERM (exit 0).
"""

from __future__ import annotations

import argparse
import logging
import os

from ..engine.engine import MAX_BATCH_SIZE, pool_positions
from ..engine.paging import PAGE
from ..engine.engine import Engine
from ..errors import MinigptError
from ..gpt2.config import GPT2Config
from ..loop.cost import gpt2_architecture, kv_bytes_per_token
from .flags import UsageError, add_model_options, bounded, load_model, non_negative_int, positive_int

DEFAULT_MAX_QUEUE = 256
port = bounded(int, lambda v: 0 <= v <= 65535, "in 0..65535")
host = bounded(str, lambda v: v.strip() != "", "an address (an empty one would listen on every interface)")


def add_parser(sub) -> None:
    p = sub.add_parser("serve", help="serve OpenAI's completions API over HTTP",
                       description="Serve /v1/completions (and /v1/models, /health, /tokenize, /detokenize, "
                                   "/tokenizer_info) on one engine that batches every request continuously. With "
                                   "the exact kernels every answer is bitwise what `generate` gives it alone "
                                   "(docs/serving.md). Needs the serve extra: pip install 'minigpt[serve]'.")
    add_model_options(p)
    p.add_argument("--host", type=host, default="127.0.0.1",
                   help="the address to listen on, IPv4, IPv6 (::1) or a name (default 127.0.0.1: this machine "
                        "only); never empty, which would listen on every interface")
    p.add_argument("--port", type=port, default=8000, help="the port (default 8000; 0: any free port)")
    p.add_argument("--max-batch-size", type=positive_int, default=MAX_BATCH_SIZE, metavar="B",
                   help=f"decode at most B sequences together (default {MAX_BATCH_SIZE})")
    p.add_argument("--kv-cache-tokens", type=positive_int, default=None, metavar="T",
                   help=f"the pool of keys and values holds T positions, in pages of {PAGE} "
                        "(default: B whole contexts)")
    p.add_argument("--max-queue", type=non_negative_int, default=DEFAULT_MAX_QUEUE, metavar="N",
                   help=f"at most N choices wait beyond the B running; more is a 429 (default {DEFAULT_MAX_QUEUE})")
    p.add_argument("--served-model-name", metavar="NAME",
                   help="the name clients give as `model` (default: --model's value)")
    p.set_defaults(run=run)


def check_pool(config: GPT2Config, args: argparse.Namespace) -> None:
    """Refuse a pool of keys and values larger than this machine's memory, naming the options."""
    positions = pool_positions(config.n_positions, args.max_batch_size, args.kv_cache_tokens)
    needed = positions * kv_bytes_per_token(gpt2_architecture("model", config))
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if needed > memory:
        raise UsageError(f"argument --max-batch-size/--kv-cache-tokens: a pool of {positions:,} positions needs "
                         f"{needed / 2**30:,.1f} GiB of keys and values, more than this machine's "
                         f"{memory / 2**30:,.1f} GiB: lower --max-batch-size or --kv-cache-tokens")


def run(args: argparse.Namespace) -> int:
    try:
        from ..server import http_server, serve
    except ImportError as e:
        raise MinigptError(f"serve needs the serve extra ({e.name} is not installed): "
                           "pip install 'minigpt[serve]'") from None
    sock = http_server.bind(args.host, args.port)  # before loading: a port in use fails at once
    with sock:
        model = load_model(args)
        if model.tokenizer_loader is not None:
            model.tokenizer  # GPT-2's tables read now: broken ones stop the server here, not its requests
        check_pool(model.config, args)
        engine = Engine(model, max_batch_size=args.max_batch_size, kv_cache_tokens=args.kv_cache_tokens)
        logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s: %(message)s")
        http_server.serve(serve.Service(model, engine, args.served_model_name or args.model, args.max_queue), sock)
    return 0
