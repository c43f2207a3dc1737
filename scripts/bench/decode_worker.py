"""Time cached decode with whichever minigpt PYTHONPATH finds (scripts/bench/batching.py compares two trees so).

    PYTHONPATH=TREE python scripts/bench/decode_worker.py PROMPT_TOKENS NEW_TOKENS

Loads random-124m and warms up; then, for every line read from stdin, generates NEW_TOKENS tokens
greedily after a fixed prompt and prints one JSON line: the median ms of the cached steps after the
first, the tokens, and the file minigpt was imported from. Uses only what every version of minigpt has.
"""

import json
import statistics
import sys

import numpy as np

import minigpt


def main() -> None:
    prompt_tokens, new_tokens = map(int, sys.argv[1:])
    model = minigpt.load("random-124m")
    prompt = np.random.default_rng(0).integers(model.config.vocab_size, size=prompt_tokens).tolist()
    minigpt.generate(model, prompt, 2, stop_at_eos=False)  # warm-up
    for _ in sys.stdin:
        result = minigpt.generate(model, prompt, new_tokens, stop_at_eos=False)
        print(json.dumps({"ms": statistics.median(result.step_seconds[1:]) * 1e3, "tokens": result.tokens,
                          "minigpt": minigpt.__file__}), flush=True)


if __name__ == "__main__":
    main()
