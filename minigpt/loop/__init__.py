"""Part 3, the loop and what it costs: choosing a token, running the naive and the cached loop, and
measuring the cost staircase of "The Autoregressive Loop & Cost" and the arithmetic of 03-01
(docs/the-loop.md, docs/sampling.md, docs/staircase.md).

Modules, in reading order:
    sampling    greedy, temperature, top-k, top-p; log-probabilities
    processing  what a request does to the logits before sampling: bias, penalties, constraints
    stops       stop strings matched in a sequence's new bytes as they come
    sequence    a request's tokens, log-probabilities and stopping rules
    loops       the naive loop and the cached loop
    cost        what the loop costs, by arithmetic
    staircase   what it costs, measured, with and without the cache
"""
