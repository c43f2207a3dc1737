"""Batched generation: many sequences decoded together, each exactly as if it were alone.

Decoding one token reads every weight once; B sequences decoded in one forward share that read
(docs/batching.md). `generate_batch` runs a *continuous batch*: a scheduler keeps up to
`max_batch_size` sequences running, each with its own sampling options and generator; a sequence
that finishes leaves at once and a waiting one takes its place in the next step, so short replies
never wait for long ones.

Keys and values live in one pool of 16-position pages (minigpt.paging) of `kv_cache_tokens`
positions. A sequence takes pages as it grows and gives them back when it ends. When the pool runs
out mid-generation, the most recently admitted running sequence is *preempted*: its pages go back
to the pool and it waits at the head of the queue; when readmitted its keys and values are
recomputed from its tokens so far. With the exact kernels every row's arithmetic is independent of
what else is in the forward, so a sequence's logits, and hence its tokens, are bitwise those it
gets alone, whatever the batch, the order of arrival, the pool size or the preemptions
(docs/paging.md).

Source: Inference Engineering (fanout.sh, inference-eng): the second fix of "The Autoregressive Loop & Cost".
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Iterator

from .errors import InputError, MinigptError, check_int
from .kernels import PAGE
from .kv_cache import pages_for
from .model import Model, check_model
from .paging import PagePool
from .sequence import GenerationResult, Request, make_request, new_sequence, with_truncate_hint

PER_PROMPT = ("max_new_tokens", "temperature", "top_k", "top_p", "seed", "stop")


def make_requests(model: Model, prompts, options: dict) -> list[Request]:
    """One checked Request per prompt. Each option is one value for all prompts or a list with one
    value per prompt (`stop`: a list of strings for all, or a list of such lists). A bad request
    is named by its index, before any work."""
    check_model(model)
    if isinstance(prompts, (str, bytes)) or not hasattr(prompts, "__len__"):
        raise InputError("prompts must be a list of token-id lists")
    per_prompt = {}
    for name in PER_PROMPT:
        value = options[name]
        listed = (isinstance(value, (list, tuple)) and (name != "stop" or any(
            v is None or isinstance(v, (list, tuple)) for v in value)))
        if listed and len(value) != len(prompts):
            raise InputError(f"{name} has {len(value)} values for {len(prompts)} prompts")
        per_prompt[name] = value if listed else [value] * len(prompts)
    requests = []
    for i, prompt in enumerate(prompts):
        try:
            requests.append(make_request(model, prompt, stop_at_eos=options["stop_at_eos"],
                                         top_logprobs=options["top_logprobs"],
                                         **{name: per_prompt[name][i] for name in PER_PROMPT}))
        except MinigptError as e:  # no truncate_prompt here: its hint would name an option this API lacks
            raise type(e)(f"prompt {i}: {with_truncate_hint(e, '')}") from None
    return requests


def new_pool(model: Model, requests: list[Request], max_batch_size: int, kv_cache_tokens: int | None) -> PagePool:
    """The page pool for a batch: kv_cache_tokens positions (default: max_batch_size whole contexts),
    refusing up front a request that could never fit in it. It never holds more than a whole context
    per request, all a batch can use: a huge max_batch_size or kv_cache_tokens allocates no more."""
    n_positions = model.config.n_positions
    if kv_cache_tokens is None:
        kv_cache_tokens = check_int(max_batch_size, "max_batch_size", 1) * n_positions
    n_pages = pages_for(min(check_int(kv_cache_tokens, "kv_cache_tokens", 1), max(1, len(requests)) * n_positions))
    for i, r in enumerate(requests):
        if pages_for(r.max_positions) > n_pages:
            raise InputError(f"prompt {i}: {len(r.prompt)} prompt tokens + {r.max_new_tokens} new tokens need "
                             f"{pages_for(r.max_positions) * PAGE} cache positions (whole pages of {PAGE}); the "
                             f"pool holds {n_pages * PAGE} (kv_cache_tokens)")
    return PagePool(model.config, n_pages)


def run(model: Model, requests: list[Request], pool: PagePool, max_batch_size: int,
        on_step: Callable[[int], None] | None = None) -> Iterator[tuple[int, GenerationResult]]:
    """The scheduler. Yields (request index, result) as each sequence finishes; on_step(new tokens)
    after every step. However it ends (finished, an error, Ctrl-C, the caller stopping early) every
    page is back in the pool.

    Each step: make room for every running sequence's next position, preempting the most recently
    admitted one while the pool is short; if none was preempted, admit waiting sequences while
    there are places and pages for their tokens; then one forward over all running sequences (a
    prefill for the newly admitted, one token for the others) and one new token each.
    """
    check_int(max_batch_size, "max_batch_size", 1)
    seqs = [new_sequence(model, r) for r in requests]
    caches = {i: pool.new_cache() for i in range(len(seqs))}
    waiting = deque(i for i, s in enumerate(seqs) if not s.done)
    running: list[int] = []  # in order of admission
    try:
        for i, s in enumerate(seqs):
            if s.done:  # max_new_tokens == 0
                yield i, s.result(use_cache=True)
        while waiting or running:
            preempted = False
            for i in list(running):  # oldest first: the newest is preempted first
                if i not in running:
                    continue
                while not pool.grow(caches[i], caches[i].length + 1):
                    victim = running.pop()
                    pool.release(caches[victim])
                    seqs[victim].preemptions += 1
                    waiting.appendleft(victim)
                    preempted = True
                    if victim == i:
                        break
            while not preempted and waiting and len(running) < max_batch_size:
                i = waiting[0]
                if not pool.grow(caches[i], len(seqs[i].ids)):
                    break
                running.append(waiting.popleft())
            if not running:
                continue
            clock = time.perf_counter()
            ids = [seqs[i].ids[caches[i].length:] for i in running]  # a prefill, or the last token
            logits = model.forward_batch(ids, [caches[i] for i in running], logits_to_keep=1)
            chosen = [seqs[i].choose(row[0]) for i, row in zip(running, logits)]
            seconds = time.perf_counter() - clock
            for i, token, row in zip(running, chosen, logits):
                seqs[i].append(token, row[0], seconds)
            if on_step is not None:
                on_step(len(running))
            for i in [i for i in running if seqs[i].done]:
                running.remove(i)
                pool.release(caches[i])
                yield i, seqs[i].result(use_cache=True)
    finally:
        for cache in caches.values():
            pool.release(cache)


def generate_batch(model: Model, prompts, max_new_tokens=40, *, temperature=0.0, top_k=None, top_p=None,
                   seed=None, stop_at_eos: bool = True, stop=None, top_logprobs: int = 0,
                   max_batch_size: int | None = None, kv_cache_tokens: int | None = None) -> list[GenerationResult]:
    """Generate for every prompt (a list of token-id lists), decoding up to `max_batch_size` of them
    together (default: all). Returns the results in prompt order.

    Each of max_new_tokens, temperature, top_k, top_p, seed and stop is one value for all prompts or a
    list with one per prompt. An int seed gives every prompt its own generator seeded with it, as
    if it were generated alone. A step's wall time counts for every token it produced. The keys and
    values of all sequences share a pool of kv_cache_tokens positions (default: max_batch_size whole
    contexts; at most one per prompt); sequences are preempted and recomputed when it runs short (see
    the module docstring).
    With the exact kernels, result i equals generate(model, prompts[i], ...) with prompt i's options.
    """
    options = dict(max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                   stop=stop, stop_at_eos=stop_at_eos, top_logprobs=top_logprobs)
    requests = make_requests(model, prompts, options)
    max_batch_size = max(1, len(requests)) if max_batch_size is None else check_int(max_batch_size, "max_batch_size", 1)
    pool = new_pool(model, requests, max_batch_size, kv_cache_tokens)
    results: list[GenerationResult | None] = [None] * len(requests)
    for i, result in run(model, requests, pool, max_batch_size):
        results[i] = result
    return results
