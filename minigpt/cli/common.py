"""Options shared by several commands."""

from __future__ import annotations

import argparse
import json
import math
import sys

from ..errors import InputError
from ..kernels import KERNELS
from ..loading import load
from ..model import Model
from ..tokenizer import encode


def add_model_options(p: argparse.ArgumentParser, default: str = "gpt2") -> None:
    p.add_argument("--model", default=default,
                   help=f"checkpoint directory, alias (gpt2, gpt2-medium, ...), hub id, random-124m or random-tiny "
                        f"(default: {default})")
    p.add_argument("--kernels", choices=list(KERNELS), default="exact",
                   help="exact: row-invariant, cache bitwise exact (default); fast: plain BLAS")


def load_model(args: argparse.Namespace) -> Model:
    return load(args.model, kernels=args.kernels)


def checked(parse, ok, requirement: str):
    """An argparse type: `parse` the text, then refuse values not `ok` as a usage error naming the option."""
    def convert(text: str):
        value = parse(text)
        if not ok(value):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text}")
        return value

    convert.__name__ = parse.__name__  # argparse's "invalid int value: 'x'" names the type by it
    return convert


positive_int = checked(int, lambda v: v >= 1, ">= 1")
non_negative_int = checked(int, lambda v: v >= 0, ">= 0")
non_negative_float = checked(float, lambda v: 0 <= v < math.inf, "a finite number >= 0")  # NaN fails too
probability = checked(float, lambda v: 0 < v <= 1, "in (0, 1]")


def print_json(document: dict) -> None:
    json.dump(document, sys.stdout, indent=2)
    print()


def encode_prompt(model: Model, text: str) -> list[int]:
    """The prompt's GPT-2 token ids; a model with another vocabulary has no tokenizer to use."""
    if model.tokenizer is None:
        raise InputError(f"this model's vocabulary has {model.config.vocab_size} tokens, not GPT-2's "
                         "50257, so it has no tokenizer for a text prompt")
    return encode(model.tokenizer, text)
