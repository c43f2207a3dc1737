"""beside: a plain request's time beside a constrained one of n = 16 sequences, on one Engine
(docs/logits-processing.md#what-a-constraint-may-cost).

random-124m (or the model named as the argument), exact kernels, greedy: the plain request (a 16-token prompt, 20 new tokens) is timed
from its submission to its end, alone and beside 16 sequences of another request, each of the ways
in BESIDE: plain too, or constrained by one of the costliest constraints the limits accept. The
goal: beside any constraint, within 2x its time beside as many plain sequences (the batch's own
cost), and within 2x its time alone where the batch costs little (interleaved rounds, the best of each).

    cd scripts && PYTHONPATH=.. python -m bench.beside [MODEL]
"""

from __future__ import annotations

import sys
import time

import numpy as np

from minigpt.engine.engine import Engine
from minigpt.loading.loader import load
from minigpt.requests.request import make_requests
from minigpt.requests.structured import MAX_CONSTRAINT_CHARS, MAX_REPETITION

from .common import REPEATS, interleaved, log

N, PROMPT_TOKENS, NEW_TOKENS, GOAL = 16, 16, 20, 2.0
BESIDE = {  # name -> the options of the n = 16 request beside the plain one (None: alone)
    "alone": None,
    "plain": {},
    f"a literal of {MAX_CONSTRAINT_CHARS:,} characters": {"regex": "ab" * (MAX_CONSTRAINT_CHARS // 2)},
    f"a repetition {MAX_REPETITION:,} times": {"regex": "(a{10}){100}"},
    "2,000 choices": {"choice": [f"c{i}" for i in range(2000)]},
}


def plain_seconds(model, prompts: list[list[int]], beside: list) -> float:
    """The plain request's time from its submission to its end, with `beside` (checked requests)
    submitted just before it on the same Engine."""
    engine = Engine(model, max_batch_size=N + 1)
    plain = make_requests(model, prompts[:1], {"max_new_tokens": NEW_TOKENS, "temperature": 0, "stop_at_eos": False})
    job, *others = engine.jobs_for([plain[0], *beside])
    engine.submit(others)
    clock = time.perf_counter()
    engine.submit([job])
    while not job.finished:
        engine.step()
    seconds = time.perf_counter() - clock
    for other in others:
        engine.cancel(other)
    while engine.pending():
        engine.step()
    return seconds


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "random-124m"
    model = load(name)  # the exact kernels
    prompts = np.random.default_rng(1).integers(model.config.vocab_size, size=(N + 1, PROMPT_TOKENS)).tolist()
    beside = {}
    for way, options in BESIDE.items():
        clock = time.perf_counter()
        beside[way] = [] if options is None else make_requests(
            model, prompts[1:], {**options, "max_new_tokens": 64, "temperature": 1.0, "seed": 0, "stop_at_eos": False})
        log(f"beside: {way} checked in {time.perf_counter() - clock:.2f} s")
    rounds = interleaved({way: lambda r=requests: plain_seconds(model, prompts, r) for way, requests in beside.items()},
                         REPEATS)
    best = {way: min(seconds) for way, seconds in rounds.items()}
    print(f"{name}, a plain request of {NEW_TOKENS} tokens beside {N} sequences of another (best of {REPEATS} rounds)")
    print("| beside it | its time, s | ÷ alone | ÷ beside plain |")
    print("| --- | ---: | ---: | ---: |")
    for way, seconds in best.items():
        print(f"| {way} | {seconds:.3f} | {seconds / best['alone']:.2f}x | {seconds / best['plain']:.2f}x |")
    worst = max(seconds for way, seconds in best.items() if way not in ("alone", "plain"))
    print(f"goal: the worst constraint within {GOAL}x beside plain: {'met' if worst <= GOAL * best['plain'] else 'NOT met'}")


if __name__ == "__main__":
    main()
