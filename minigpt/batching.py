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
(docs/batching.md; the pages themselves: docs/paging.md).

Source: Inference Engineering (fanout.sh, inference-eng): the second fix of "The Autoregressive Loop & Cost".
"""

from __future__ import annotations

import time
from collections import deque
from typing import Callable, Iterator

from .gpt2 import GPT2
from .paging import PagePool, forward_batch
from .sequence import GenerationResult, Request, Sequence


def run(gpt: GPT2, requests: list[Request], pool: PagePool, max_batch_size: int,
        on_step: Callable[[int], None] | None = None) -> Iterator[tuple[int, GenerationResult]]:
    """The scheduler. Yields (request index, result) as each sequence finishes; on_step(new tokens)
    after every step. However it ends (finished, an error, Ctrl-C, the caller stopping early) every
    page is back in the pool.

    Each step: make room for every running sequence's next position, preempting the most recently
    admitted one while the pool is short; if none was preempted, admit waiting sequences while
    there are places and pages for their tokens; then one forward over all running sequences (a
    prefill for the newly admitted, one token for the others) and one new token each.
    """
    seqs = [Sequence(r) for r in requests]
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
            logits = forward_batch(gpt, ids, [caches[i] for i in running], logits_to_keep=1)
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
