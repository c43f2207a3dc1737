"""Benchmark minigpt on GPT-2-small shapes: against transformers, this machine's ceilings and itself.

    PYTHONPATH=. python scripts/benchmark.py [--only SECTION [SECTION ...]] [--docs docs] [--runs N]

Sections (default: all, in this order), one module each in scripts/bench/:

- decode: one sequence; cached decode, prefill, flatness and the naive loop, minigpt (exact and
  fast kernels) against transformers and the model's own products alone (docs/benchmarks.md);
- batching: aggregate tokens/s at B = 1 .. 32, exact, fast and transformers' batched generate
  (docs/batching.md);
- paging: 64 mixed requests one by one, and through continuous batching with an ample and a
  tight page pool (docs/paging.md);
- prefix: the Engine's prefix cache on and off, on a shared prompt prefix and on multiple-choice
  scoring (docs/prefix-cache.md);
- speculative: plain decode against speculative decoding with four drafters (docs/speculative.md);
- serve: the completions server at 1, 4, 16 and 32 concurrent clients, exact and fast kernels, against
  the same requests one at a time (docs/serving.md);
- determinism: one prompt N times (greedy, and seeded at temperature 1) to a loaded server, exact and
  fast kernels: distinct completions and where they first differ (docs/serving.md; --runs N, default
  100; Thinking Machines' experiment is --runs 1000);
- structured: what a request's logits processing costs a decode step, at B = 1 and 16, exact and fast
  kernels, against plain decoding (docs/logits-processing.md);
- scale: cost as the work grows: load time and peak memory per GPT-2 size, decode and prefill
  against the context, each beside transformers (docs/staircase.md).

Everything a section compares is measured in the same run, side by side, and reported as ratios
(timings on a shared machine are noisy; ratios measured together are not much). Measurements are
repeated in interleaved rounds and the best kept: interference only ever adds time. Each section
prints a markdown block: the machine, the load average and the results. With --docs DIR each block
replaces the one between its markers in its chapter (DIR/benchmarks.md, DIR/batching.md, ...) and
its plots go to DIR/img/. At the end of the run every section's targets, met or missed, are printed
for the developers; they are never written into the docs. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from bench import batching, decode, determinism, paging, prefix, scale, serve, speculative, structured  # noqa: E402
from bench.common import log, timed, write_block  # noqa: E402
from minigpt.errors import MinigptError  # noqa: E402
from minigpt.cli.pictures import require_matplotlib  # noqa: E402

SECTIONS = {"decode": decode, "batching": batching, "paging": paging, "prefix": prefix, "speculative": speculative,
            "serve": serve, "determinism": determinism, "structured": structured, "scale": scale}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=SECTIONS, metavar="SECTION",
                        help=f"run only these sections ({', '.join(SECTIONS)}; default: all)")
    parser.add_argument("--docs", type=Path, metavar="DIR",
                        help="write each section's results into its chapter in DIR and its plots into DIR/img")
    parser.add_argument("--runs", type=int, default=determinism.RUNS, metavar="N",
                        help=f"determinism: send the probe N times per kernel set and decoding (default "
                             f"{determinism.RUNS}; Thinking Machines' experiment: 1000)")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs: must be at least 1, got {args.runs}")
    if args.docs is not None:  # fail now, not after minutes of measuring
        if not (args.docs / "img").is_dir():
            parser.error(f"--docs: no directory {str(args.docs / 'img')!r} for the plots")
        try:
            require_matplotlib()
        except MinigptError as e:
            parser.error(str(e))
    summaries = []
    for name in [n for n in SECTIONS if n in (args.only or SECTIONS)]:
        section = SECTIONS[name]
        report, seconds = timed(lambda: section.run(args.runs) if section is determinism else section.run())
        log(f"{name}: {seconds:.0f} s")
        print(f"## {name}\n\n{report.block}\n", flush=True)
        summaries.append(report.info.summary(section.TITLE, report.targets))
        if args.docs is not None:
            write_block(args.docs / section.DOC, section.BLOCK, report.block)
            for file_name, plot in report.plots.items():
                plot(args.docs / "img" / file_name)
    print("## Targets\n\n" + "\n\n".join(summaries), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
