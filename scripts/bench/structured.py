"""structured: what a request's logits processing costs a decode step (docs/logits-processing.md).

random-124m, exact and fast kernels, greedy, B = 1 and 16 different 16-token prompts, 32 new tokens
each, never stopping at end of text, on one Engine (all B rows in every step). Each way is a set of
options every request carries (WAYS): plain decoding, and the penalties (logit_bias on 8 tokens,
presence, frequency and repetition penalties, min_tokens), which process every row a step chooses
from. Decode time per token = the median step (the wall time between the ends of two steps, 2 to
32, after the prefill: the forward and every row's processing and choice) / B; each way is compared
with plain decoding of the same kernels and B as the ratio of their best rounds (interleaved rounds:
interference only ever adds time). In the same rounds, the time a sequence takes to choose one token
from a row, its processing included, measured alone. A way is one entry of WAYS: a JSON schema
(name, age, tags) constrains the text with llguidance's mask; for it, in the same rounds, the time
to compile the schema (once per request), and apart the time to build llguidance's view of GPT-2's
tokenizer (once per tokenizer).
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from minigpt.loop.sequence import Sequence
from minigpt.engine.engine import Engine
from minigpt.api.api import generate_batch
from minigpt.requests.request import make_requests, one_constraint
from minigpt.requests.structured import compile_constraint, ll_tokenizer

from .common import REPEATS, Report, RunInfo, Target, interleaved, log, minigpt_engines

TITLE, DOC, BLOCK = "Logits processing", "logits-processing.md", "structured"
BATCH_SIZES = (1, 16)
PROMPT_TOKENS, NEW_TOKENS = 16, 32
GOAL = 1.1  # a processed step within 1.1x a plain one
WAYS = {  # name -> the options every request of the batch carries
    "plain": {},
    "penalties": dict(logit_bias={t: (-1) ** t * 5.0 for t in range(100, 108)}, presence_penalty=0.5,
                      frequency_penalty=0.5, repetition_penalty=1.2, min_tokens=4),
    "JSON schema": dict(json_schema={"type": "object", "properties": {
        "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["name", "age", "tags"]}),
}
CONSTRAINED = [way for way, options in WAYS.items() if one_constraint(options)]


def step_ms(model, prompts: list[list[int]], options: dict) -> float:
    """The median decode step (ms, wall time from one step's end to the next's: every row's
    forward, processing and choice) of an Engine running the prompts with these options."""
    engine = Engine(model, max_batch_size=len(prompts))
    requests = make_requests(model, prompts, {**options, "max_new_tokens": NEW_TOKENS, "stop_at_eos": False})
    ends = [time.perf_counter()]
    for _ in engine.results(engine.jobs_for(requests), lambda tokens: ends.append(time.perf_counter())):
        pass
    return statistics.median(np.diff(ends)[1:]) * 1e3  # the first: the prefill


def choice_us(model, prompt: list[int], options: dict) -> float:
    """The median time (us) a sequence with these options takes to choose one token from a row of
    random logits [vocab], its processing included, after NEW_TOKENS tokens it chose from that row."""
    options = {**options, "max_new_tokens": NEW_TOKENS + 1, "stop_at_eos": False}
    seq = Sequence(make_requests(model, [prompt], options)[0])
    row = np.random.default_rng(0).standard_normal(model.config.vocab_size).astype(np.float32)
    for _ in range(NEW_TOKENS):  # tokens of its own choosing: a constraint's state follows them
        if not seq.done:
            seq.append(seq.choose(row), row, 0.0)
    times = []
    for _ in range(200):
        clock = time.perf_counter()
        seq.choose(row)
        times.append(time.perf_counter() - clock)
    return statistics.median(times) * 1e6


def compile_ms(model, options: dict) -> float:
    """The time (ms) to compile a way's constraint for GPT-2's tokenizer, as make_request does."""
    clock = time.perf_counter()
    compile_constraint(model.tokenizer, *one_constraint(options))
    return (time.perf_counter() - clock) * 1e3


def run() -> Report:
    info = RunInfo()
    engines = minigpt_engines()
    model = next(iter(engines.values()))
    prompts = np.random.default_rng(1).integers(model.config.vocab_size,
                                                size=(max(BATCH_SIZES), PROMPT_TOKENS)).tolist()
    clock = time.perf_counter()
    ll_tokenizer(model.tokenizer, "json_schema")  # llguidance's view of the tokenizer: once per tokenizer
    trie_s = time.perf_counter() - clock
    for m in engines.values():
        generate_batch(m, prompts[:2], 2, stop_at_eos=False)  # warm-up
    log(f"structured: {', '.join(WAYS)} at B = {', '.join(map(str, BATCH_SIZES))} ...")
    rounds = interleaved({**{(name, way, b): lambda m=m, way=way, b=b: step_ms(m, prompts[:b], WAYS[way])
                             for name, m in engines.items() for way in WAYS for b in BATCH_SIZES},
                          **{("choice", way): lambda way=way: choice_us(model, prompts[0], WAYS[way]) for way in WAYS},
                          **{("compile", way): lambda way=way: compile_ms(model, WAYS[way]) for way in CONSTRAINED}})
    choice = {way: min(rounds.pop(("choice", way))) for way in WAYS}
    compiled = {way: min(rounds.pop(("compile", way))) for way in CONSTRAINED}

    lines = [*info.header(),
             f"### Results (median step, the best of {REPEATS} interleaved rounds; random-124m, float32, "
             f"greedy, {PROMPT_TOKENS}-token prompts, {NEW_TOKENS} new tokens)", "",
             "penalties: " + ", ".join(f"{k}={v}" if k != "logit_bias" else f"logit_bias on {len(v)} tokens (±5)"
                                       for k, v in WAYS["penalties"].items()) + ".", "",
             "| kernels | B | way | step, ms | per token, ms | ÷ plain |",
             "| --- | ---: | --- | ---: | ---: | ---: |"]
    targets: list[Target] = []
    for name in engines:
        for b in BATCH_SIZES:
            plain = rounds[name, "plain", b]
            for way in WAYS:
                ms = rounds[name, way, b]
                ratio = min(ms) / min(plain)  # the best of each: interference only ever adds time
                lines.append(f"| {name.removeprefix('minigpt ')} | {b} | {way} | {min(ms):.1f} | {min(ms) / b:.2f} | "
                             f"{ratio:.3f}x |")
                if way != "plain":
                    targets.append((f"{name.removeprefix('minigpt ')}, B = {b}: a {way} step <= {GOAL}x a plain one",
                                    f"{ratio:.3f}x", ratio <= GOAL))
    lines += ["", "Choosing one token from a row of 50,257 logits, processing included (median of 200, best round; "
              f"after {NEW_TOKENS} tokens): " + ", ".join(f"{way} {us:.0f} us" for way, us in choice.items()) + ".",
              "", "Compiling a constraint for GPT-2's tokenizer (llguidance, the first mask included; best round): "
              + ", ".join(f"{way} {ms:.2f} ms" for way, ms in compiled.items()) + f"; llguidance's view of the "
              f"tokenizer, built once per tokenizer: {trie_s:.2f} s."]
    return Report(info, "\n".join(lines), targets)
