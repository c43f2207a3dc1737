"""Generate the committed parity fixtures: small random GPT-2 checkpoints and Hugging Face's outputs on them.

For each entry of FIXTURES: random weights (`minigpt.gpt2.params.random_params`) are written by
`minigpt.loading.checkpoint_writer.save_checkpoint`, in one of the layouts minigpt loads, to tests/fixtures/NAME/;
transformers' `GPT2LMHeadModel.from_pretrained` loads that directory (float32, eval mode) and runs
it on fixed token ids; its logits and greedy continuation go to NAME/reference.npz. tests/gpt2/test_parity.py
checks minigpt against these files without torch, and calls `hf_reference` itself when transformers is
installed, so the committed and the live references are computed by the same lines.

    pip install -e '.[parity]'
    python scripts/make_fixtures.py            # rewrites tests/fixtures/
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout, installed or not

from minigpt.loading.checkpoint_writer import save_checkpoint  # noqa: E402
from minigpt.gpt2.config import GPT2Config  # noqa: E402
from minigpt.loading.weights import random_params  # noqa: E402

FIXTURES_DIR = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
REFERENCE_FILE = "reference.npz"
# random_params' scale: at 1 (Hugging Face's init) every logit is ~0.1 and greedy decoding hinges on
# near-ties; at 20 the logits spread over roughly +-10, so the argmax is decided by clear margins.
SCALE = 20.0
# minigpt's logits must be within TOLERANCE x max|logit| of these references (tests/gpt2/test_parity.py says why).
TOLERANCE = 1e-4


@dataclass(frozen=True)
class Fixture:
    """One committed checkpoint: its shapes, its storage layout (save_checkpoint's options) and its run."""

    name: str
    config: GPT2Config
    layout: dict = field(default_factory=dict)
    seed: int = 0
    prompt_len: int = 16
    new_tokens: int = 10


# Small shapes (the whole folder stays well under 2 MB). Together they cover every storage dtype, both
# tensor namings, the hub file's mask buffers, a stored lm_head, shards, 1 to 4 heads of 8 to 32 dims,
# n_positions that are no multiple of the 16-key attention block (hub-layout fills all 40 positions)
# and a LayerNorm epsilon large enough that ignoring it moves the logits 20x the tolerance.
FIXTURES = (
    Fixture("float32", GPT2Config(vocab_size=384, n_positions=32, n_embd=32, n_head=2, n_layer=2,
                                  eos_token_id=None), seed=1),
    Fixture("float16", GPT2Config(vocab_size=512, n_positions=48, n_embd=48, n_head=4, n_layer=2,
                                  eos_token_id=None), {"dtype": "float16"}, seed=2, prompt_len=20),
    Fixture("bfloat16", GPT2Config(vocab_size=1000, n_positions=64, n_embd=32, n_head=4, n_layer=2,
                                   eos_token_id=None), {"dtype": "bfloat16"}, seed=3, prompt_len=24),
    Fixture("hub-layout", GPT2Config(vocab_size=128, n_positions=40, n_embd=64, n_head=4, n_layer=2,
                                     eos_token_id=None), {"dtype": "float16", "prefix": "", "attn_bias": True},
            seed=5, prompt_len=28, new_tokens=12),
    Fixture("sharded-lm-head", GPT2Config(vocab_size=300, n_positions=40, n_embd=32, n_head=1, n_layer=3,
                                          layer_norm_epsilon=1e-3, eos_token_id=None),
            {"shards": 3, "lm_head": True}, seed=6),
)


def hf_reference(directory: Path, prompt: np.ndarray, new_tokens: int, attn_implementation: str = "eager") -> dict:
    """Hugging Face's float32 logits [T, vocab] on `prompt` and its greedy continuation of the checkpoint.

    Returns logits, step_logits [new_tokens, vocab] (the logits each generated token was chosen from),
    tokens (greedy, with the cache) and rounding: max |float32 - float64 logits| / max |logit|, how far
    float32 itself is from the exact result. Fails unless the reference can decide a parity test at
    TOLERANCE: every weight loaded as stored, rounding under TOLERANCE / 10 (large random weights make
    deep models chaotic in float32), greedy margins over 10 x TOLERANCE, the same tokens without the cache.
    """
    import torch

    ids = torch.tensor(prompt, dtype=torch.long)[None]  # [1, T]
    with torch.inference_mode():
        model = load_hf(directory, torch.float32, attn_implementation)
        logits = model(ids).logits[0]  # [T, vocab]
        cached = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, use_cache=True, output_logits=True,
                                return_dict_in_generate=True, attention_mask=torch.ones_like(ids), pad_token_id=0)
        # Without the cache, the greedy loop's step n is row T-1+n of one causal pass over the whole sequence.
        sequence = cached.sequences[:, :-1]  # [1, T + new_tokens - 1]
        uncached = model(sequence).logits[0, len(prompt) - 1:].argmax(-1)  # [new_tokens]
        del model
        exact = load_hf(directory, torch.float64, attn_implementation)(ids).logits[0]  # [T, vocab]
    scale = logits.abs().max().item()
    rounding = (logits.double() - exact).abs().max().item() / scale
    step_logits = torch.cat(cached.logits).numpy()  # [new_tokens, vocab]
    tokens = cached.sequences[0, len(prompt):]
    if rounding > TOLERANCE / 10:
        raise RuntimeError(f"{directory}: float32 logits are {rounding:.2g} of their scale from float64's: "
                           f"too ill-conditioned to test parity at {TOLERANCE}; use smaller weights")
    if top2_margin(step_logits) < 10 * TOLERANCE * scale:
        raise RuntimeError(f"{directory}: a greedy step is a near-tie (margin {top2_margin(step_logits):.2g}), "
                           "which rounding could flip; change the seed")
    if not torch.equal(tokens, uncached):
        raise RuntimeError(f"{directory}: transformers' greedy tokens differ with and without its cache")
    return {"logits": logits.numpy(), "step_logits": step_logits, "tokens": tokens.numpy(), "rounding": rounding}


def load_hf(directory: Path, dtype, attn_implementation: str):
    """transformers' GPT2LMHeadModel of the checkpoint in `dtype`, eval mode; fails if any weight is not as stored."""
    from transformers import GPT2LMHeadModel

    model, info = GPT2LMHeadModel.from_pretrained(
        directory, torch_dtype=dtype, attn_implementation=attn_implementation, output_loading_info=True
    )
    if info["missing_keys"] or info["mismatched_keys"]:
        raise RuntimeError(f"transformers did not load {directory} as it is: {info}")
    return model.eval()


def top2_margin(logits: np.ndarray) -> float:
    """The smallest gap between the largest and second-largest logit of any row: how firm the argmaxes are."""
    top2 = np.sort(logits, axis=-1)[:, -2:]
    return float((top2[:, 1] - top2[:, 0]).min())


def make_fixture(fixture: Fixture, out: Path) -> Path:
    """Write one checkpoint and its reference.npz into out/NAME."""
    import torch
    import transformers

    directory = out / fixture.name
    shutil.rmtree(directory, ignore_errors=True)
    save_checkpoint(directory, fixture.config, random_params(fixture.config, fixture.seed, SCALE), **fixture.layout)
    prompt = np.random.default_rng(fixture.seed).integers(0, fixture.config.vocab_size, fixture.prompt_len)
    ref = hf_reference(directory, prompt, fixture.new_tokens)
    np.savez_compressed(
        directory / REFERENCE_FILE, ids=prompt.astype(np.int64), logits=ref["logits"],
        step_logits=ref["step_logits"], tokens=ref["tokens"].astype(np.int64), rounding=np.float64(ref["rounding"]),
        transformers_version=np.array(transformers.__version__), torch_version=np.array(torch.__version__),
        attn_implementation=np.array("eager"),
    )
    print(f"{fixture.name}: {fixture.config} {fixture.layout}; max|logit| {np.abs(ref['logits']).max():.3g}, "
          f"greedy margin {top2_margin(ref['step_logits']):.3g}, float32 rounding {ref['rounding']:.2g}")
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIXTURES_DIR, help=f"default: {FIXTURES_DIR}")
    args = parser.parse_args()
    from transformers.utils import logging

    logging.set_verbosity_error()  # its load report lists the ignored attn.masked_bias buffers
    logging.disable_progress_bar()
    for fixture in FIXTURES:
        make_fixture(fixture, args.out)


if __name__ == "__main__":
    main()
