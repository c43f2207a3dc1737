"""The engine's forward is part 1's: batched.forward_batch, over sequences scattered in a page
pool and fed in chunks beside each other, gives every sequence bitwise gpt2.forward's logits."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from minigpt.testing import assert_bitwise
from minigpt.testing.strategies import models, token_ids

from minigpt.gpt2.forward import forward
from minigpt.exact.batched import forward_batch
from minigpt.engine.paging import PAGE, PagedCache, PagePool, pages_for


@given(st.data())
def test_paged_batched_forward_gives_every_sequence_bitwise_the_plain_forwards_logits(data):
    """1-4 sequences share a pool whose free pages are shuffled (so their pages interleave); each
    step feeds every unfinished sequence its next chunk of 1-20 ids in one forward_batch. Every
    sequence's logits, concatenated over its chunks, equal gpt2.forward over all its ids, bit for bit."""
    model = data.draw(models())
    sequences = data.draw(st.lists(token_ids(model.config), min_size=1, max_size=4), label="sequences")
    pool = PagePool(model.config, sum(pages_for(len(ids)) for ids in sequences) + data.draw(st.integers(0, 3)))
    order = data.draw(st.permutations(range(pool.n_pages)), label="page order")
    pool.free[:] = False
    caches = [PagedCache(pool) for _ in sequences]
    for cache, ids in zip(caches, sequences):  # pages taken in the drawn order, not one run each
        for _ in range(pages_for(len(ids))):
            page = order.pop(0)
            cache.pages.append(page)
    logits = [[] for _ in sequences]
    while any(cache.length < len(ids) for cache, ids in zip(caches, sequences)):
        live = [i for i, ids in enumerate(sequences) if caches[i].length < len(ids)]
        chunks = [sequences[i][caches[i].length:caches[i].length + data.draw(st.integers(1, 20))] for i in live]
        for i, rows in zip(live, forward_batch(model, chunks, [caches[i] for i in live], [0] * len(live))):
            logits[i].append(rows)
    for ids, rows in zip(sequences, logits):
        assert_bitwise(forward(model, ids), np.concatenate(rows), f"{len(ids)} ids, pages of {PAGE}")
