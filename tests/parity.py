"""The parity references for the tests that compare with transformers: scripts/make_fixtures.py,
the committed fixtures it made, their tolerance, and the checkpoint layouts checked live."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from minigpt.gpt2.config import GPT2Config

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    """A module of scripts/ (which is not a package), imported from its file."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


make_fixtures = load_script("make_fixtures")  # imports torch only when a reference is computed
TOLERANCE = make_fixtures.TOLERANCE
FIXTURE_DIRS = sorted(p.parent for p in make_fixtures.FIXTURES_DIR.glob(f"*/{make_fixtures.REFERENCE_FILE}"))
KERNELS = ("exact", "fast")

# save_checkpoint options: between them, each dtype, naming, buffer, lm_head and sharding choice meets the others.
LAYOUTS = {
    "save_pretrained": {},
    "hub-file": {"prefix": "", "attn_bias": True},
    "float16-lm-head": {"dtype": "float16", "lm_head": True},
    "bfloat16-bare-sharded": {"dtype": "bfloat16", "prefix": "", "shards": 3},
    "bfloat16-all-extras": {"dtype": "bfloat16", "attn_bias": True, "lm_head": True, "shards": 2},
    "float16-hub-sharded": {"dtype": "float16", "prefix": "", "attn_bias": True, "lm_head": True, "shards": 4},
}
LIVE_CONFIG = GPT2Config(vocab_size=256, n_positions=48, n_embd=32, n_head=4, n_layer=2, eos_token_id=None)
