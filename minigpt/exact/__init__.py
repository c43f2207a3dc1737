"""Part 4, new: exactness. Kernels whose every row has the same bits whatever else is computed with
it, so that the cache, batching, paging and speculation change no bit; and the proof, run as an
experiment (docs/exactness.md).

Modules, in reading order:
    threads       the thread count and alignment that decide bits, and the worker threads
    tuning        how the kernels cut the weights, which decides no bit, and the kept choices
    linear        the exact linear map: a gemv per row, in aligned calls
    attention     the exact attention: tiles of TILE keys, fixed sums, one division
    fast          FAST's operations: plain NumPy made quicker, not batch-invariant
    kernels       the kernel sets EXACT and FAST, each with every operation a forward or a batched forward calls
    batched       the batched forward: many sequences' new positions through the weights at once, each row as alone
    tuner         measuring the fastest cut on this machine (`tune`)
    tracing       a forward that keeps every layer
    causal_proof  the proof that the cache is exact, bit for bit
"""
