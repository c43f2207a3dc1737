"""Part 5, the engine: many sequences served together on paged KV memory, each bitwise as if alone
(docs/paging.md, docs/batching.md, docs/prefix-cache.md, docs/speculative.md).

Modules, in reading order:
    paging       paged KV memory, and the prefix cache: full pages kept under the chained hash of their prefix
    batched      the batched forward: many sequences' new positions through the weights at once
    scheduler    continuous batching with a prefix cache: admission, eviction, preemption
    speculative  more tokens per read: drafters and exact verification
"""
