"""Part 7, the engine: many sequences served together on paged KV memory, each bitwise as if alone
(docs/paging.md, docs/batching.md, docs/prefix-cache.md, docs/speculative.md).

Modules, in reading order:
    paging       paged KV memory, and the prefix cache: full pages kept under the chained hash of their prefix
    job          a request in the engine: its sequence, its pages, where it is, its result
    scheduler    continuous batching: which jobs run next (admission, preemption, the prefix cache's hits)
    masks        the mask thread: grammar masks computed beside the steps; a job whose mask is late sits out
    drafters     guessing tokens: prompt lookup, a draft model, and the contract a drafter of one's own keeps
    speculative  more tokens per read: several drafts checked in one forward, exactly
    engine       Engine: a pool and a scheduler across calls; a step schedules, runs the model, records
"""
