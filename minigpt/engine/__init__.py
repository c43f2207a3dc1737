"""Part 5, the engine: many sequences served together on paged KV memory, each bitwise as if alone
(docs/paging.md, docs/batching.md, docs/prefix-cache.md, docs/speculative.md).

Modules, in reading order:
    paging       paged KV memory, pages kept for their prefix, and the batched forward
    scheduler    continuous batching with a prefix cache: admission, eviction, preemption
    speculative  more tokens per read: drafters and exact verification
"""
