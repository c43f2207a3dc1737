"""Write a GPT-2 checkpoint with random weights, in any layout Hugging Face uses.

For tests and benchmarks that need a checkpoint directory without downloading one:

    python scripts/make_checkpoint.py /tmp/tiny --size random-tiny --bpe-dir DIR

The sizes are GPT-2's and the embedded random-tiny's; with the default seed 0 the weights are those
`minigpt.load` builds for random-tiny (and, with --size gpt2, for random-124m). --bpe-dir names a
folder with GPT-2's BPE tables; they are copied in under the hub's names (vocab.json, merges.txt)
so the directory is a complete, self-contained model.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from minigpt.loading.checkpoint import PREFIX  # noqa: E402
from minigpt.loading.checkpoint_writer import save_checkpoint  # noqa: E402
from minigpt.cli import Parser  # noqa: E402
from minigpt.cli.flags import non_negative_int, positive_int  # noqa: E402
from minigpt.gpt2.config import GPT2_SIZES  # noqa: E402
from minigpt.errors import TokenizerError  # noqa: E402
from minigpt.loading.loader import EMBEDDED  # noqa: E402
from minigpt.loading.weights import random_params  # noqa: E402
from minigpt.loading.safetensors_format import ENCODINGS  # noqa: E402
from minigpt.loading.tokenizer import BPE_FILE_PAIRS, find_bpe_files  # noqa: E402

SIZES = {**GPT2_SIZES, "random-tiny": EMBEDDED["random-tiny"]}
HUB_BPE_FILES = BPE_FILE_PAIRS[-1]  # (merges.txt, vocab.json): the names a checkpoint carries them under


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="make_checkpoint.py", description=__doc__.splitlines()[0])  # errors: one line, exit 2
    parser.add_argument("out_dir", type=Path, metavar="OUT_DIR")
    parser.add_argument("--size", choices=SIZES, default="random-tiny")
    parser.add_argument("--seed", type=non_negative_int, default=0)
    parser.add_argument("--dtype", choices=ENCODINGS, default="float32")
    parser.add_argument("--no-prefix", action="store_true", help="name tensors h.0... as the hub's gpt2 file does")
    parser.add_argument("--shards", type=positive_int, default=1,
                        help="split the weights into this many files, each with one tensor at least")
    parser.add_argument("--lm-head", action="store_true", help="also store lm_head.weight (= wte)")
    parser.add_argument("--attn-bias", action="store_true", help="also store the causal-mask buffers")
    parser.add_argument("--bpe-dir", type=Path,
                        help="folder with GPT-2's BPE tables: encoder.json and vocab.bpe (or vocab.json and merges.txt)")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        bpe_files = args.bpe_dir and find_bpe_files(args.bpe_dir)
    except TokenizerError as e:  # a symlink loop or a FIFO where a table belongs, an unsearchable folder
        parser.error(f"argument --bpe-dir: {e}")
    if args.bpe_dir and bpe_files is None:
        parser.error(f"--bpe-dir {args.bpe_dir} must hold "
                     + " or ".join(f"{vocab} and {merges}" for merges, vocab in BPE_FILE_PAIRS))
    if args.out_dir.exists() and not args.out_dir.is_dir():
        parser.error(f"OUT_DIR {args.out_dir} exists and is not a directory")
    config = SIZES[args.size]
    params = random_params(config, args.seed)
    try:
        save_checkpoint(
            args.out_dir, config, params, dtype=args.dtype, prefix="" if args.no_prefix else PREFIX,
            shards=args.shards, lm_head=args.lm_head, attn_bias=args.attn_bias,
        )
        if args.bpe_dir:
            for source, target in zip(bpe_files, HUB_BPE_FILES):
                shutil.copyfile(source, args.out_dir / target)
    except ValueError as e:  # the shard count, checked before anything is written
        parser.error(f"argument --shards: {e}")
    except OSError as e:
        print(f"error: cannot write {e.filename or args.out_dir}: {e.strerror or e}", file=sys.stderr)
        sys.exit(1)
    print(f"wrote {args.size}'s shapes with random weights (seed {args.seed}) to {args.out_dir}")


if __name__ == "__main__":
    main()
