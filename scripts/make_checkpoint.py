"""Write a GPT-2 checkpoint with random weights, in any layout Hugging Face uses.

For tests and benchmarks that need a checkpoint directory without downloading one:

    python scripts/make_checkpoint.py /tmp/tiny --size tiny --bpe-dir DIR

--bpe-dir names a folder with GPT-2's encoder.json and vocab.bpe; they are copied in under the
hub's names (vocab.json, merges.txt) so the directory is a complete, self-contained model.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from minigpt.checkpoint import PREFIX, save_checkpoint  # noqa: E402
from minigpt.config import GPT2_SIZES, GPT2Config  # noqa: E402
from minigpt.params import random_params  # noqa: E402
from minigpt.safetensors_format import ENCODINGS  # noqa: E402

SIZES = {**GPT2_SIZES, "tiny": GPT2Config(n_layer=2, n_embd=64, n_head=4, n_positions=128)}
BPE_FILES = {"encoder.json": "vocab.json", "vocab.bpe": "merges.txt"}  # GPT-2's name -> the hub's


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--size", choices=SIZES, default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", choices=ENCODINGS, default="float32")
    parser.add_argument("--no-prefix", action="store_true", help="name tensors h.0... as the hub's gpt2 file does")
    parser.add_argument("--shards", type=int, default=1, help="split the weights into this many files")
    parser.add_argument("--lm-head", action="store_true", help="also store lm_head.weight (= wte)")
    parser.add_argument("--attn-bias", action="store_true", help="also store the causal-mask buffers")
    parser.add_argument("--bpe-dir", type=Path, help="folder with GPT-2's encoder.json and vocab.bpe")
    args = parser.parse_args(argv)
    if args.shards < 1:
        parser.error("--shards must be at least 1")
    if args.bpe_dir and not all((args.bpe_dir / name).is_file() for name in BPE_FILES):
        parser.error(f"--bpe-dir {args.bpe_dir} must hold {' and '.join(BPE_FILES)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    config = SIZES[args.size]
    save_checkpoint(
        args.out_dir, config, random_params(config, args.seed), dtype=args.dtype,
        prefix="" if args.no_prefix else PREFIX, shards=args.shards, lm_head=args.lm_head,
        attn_bias=args.attn_bias,
    )
    if args.bpe_dir:
        for source, target in BPE_FILES.items():
            shutil.copyfile(args.bpe_dir / source, args.out_dir / target)
    print(f"wrote a random {args.size} checkpoint to {args.out_dir}")


if __name__ == "__main__":
    main()
