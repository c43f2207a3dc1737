"""Part 4, new: exactness. Kernels whose every row has the same bits whatever else is computed with
it, so that the cache, batching, paging and speculation change no bit; and the proof, run as an
experiment (docs/exactness.md).

Modules, in reading order:
    tuning        the thread count and alignment that decide bits; how the kernels cut the weights, which does not
    kernels       the row-invariant EXACT kernels and FAST, plain NumPy made quicker
    tuner         measuring the fastest cut on this machine (`tune`)
    tracing       a forward that keeps every layer
    causal_proof  the proof that the cache is exact, bit for bit
    inspection    one forward kept for a reader: attention per head, the residual stream, the logit lens
"""
