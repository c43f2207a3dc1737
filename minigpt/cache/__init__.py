"""Part 2, the KV cache: what it adds to part 1's forward, and nothing else (docs/kv-cache.md).

Under the causal mask an old position never sees a new token, so its keys and values can be kept
and each new token computed alone against them.

Modules, in reading order:
    kv_cache  a contiguous, preallocated store and forward_cached, part 1's forward with its NEW lines
"""
