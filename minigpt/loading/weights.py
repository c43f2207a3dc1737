"""GPT-2's weights by their checkpoint names: the shapes a config implies, the dataclasses of
minigpt.gpt2.params to and from name -> array, and deterministic random weights.

The dataclasses hold the checkpoint's arrays as they are: a linear layer's weight [n_in, n_out]
(Hugging Face's Conv1D), which minigpt.gpt2.params keeps, so nothing is transposed or copied here.
"""

from __future__ import annotations

import math

import numpy as np

from ..gpt2.config import GPT2Config
from ..gpt2.params import Block, GPT2Params, LayerNorm, Linear, MLP, Attention


BLOCK_TENSORS = 12  # tensors per block in expected_shapes: ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj


def expected_shapes(config: GPT2Config) -> dict[str, tuple[int, ...]]:
    """Every tensor name of a GPT-2 checkpoint (without the `transformer.` prefix) and its shape there."""
    C, V, P = config.n_embd, config.vocab_size, config.n_positions
    shapes = {"wte.weight": (V, C), "wpe.weight": (P, C), "ln_f.weight": (C,), "ln_f.bias": (C,)}
    for i in range(config.n_layer):
        shapes.update({
            f"h.{i}.ln_1.weight": (C,), f"h.{i}.ln_1.bias": (C,),
            f"h.{i}.attn.c_attn.weight": (C, 3 * C), f"h.{i}.attn.c_attn.bias": (3 * C,),
            f"h.{i}.attn.c_proj.weight": (C, C), f"h.{i}.attn.c_proj.bias": (C,),
            f"h.{i}.ln_2.weight": (C,), f"h.{i}.ln_2.bias": (C,),
            f"h.{i}.mlp.c_fc.weight": (C, 4 * C), f"h.{i}.mlp.c_fc.bias": (4 * C,),
            f"h.{i}.mlp.c_proj.weight": (4 * C, C), f"h.{i}.mlp.c_proj.bias": (C,),
        })
    return shapes


def params_from_tensors(config: GPT2Config, t: dict[str, np.ndarray]) -> GPT2Params:
    """Assemble the dataclasses from name -> float32 array (names and shapes as in `expected_shapes`),
    holding the arrays themselves: a mapped checkpoint's stay mapped."""
    def linear(prefix: str) -> Linear:
        return Linear(t[f"{prefix}.weight"], t[f"{prefix}.bias"])  # [in, out], as stored

    def norm(prefix: str) -> LayerNorm:
        return LayerNorm(t[f"{prefix}.weight"], t[f"{prefix}.bias"])

    blocks = tuple(
        Block(
            ln_1=norm(f"h.{i}.ln_1"),
            attn=Attention(linear(f"h.{i}.attn.c_attn"), linear(f"h.{i}.attn.c_proj")),
            ln_2=norm(f"h.{i}.ln_2"),
            mlp=MLP(linear(f"h.{i}.mlp.c_fc"), linear(f"h.{i}.mlp.c_proj")),
        )
        for i in range(config.n_layer)
    )
    return GPT2Params(wte=t["wte.weight"], wpe=t["wpe.weight"], h=blocks, ln_f=norm("ln_f"))


def params_to_tensors(params: GPT2Params) -> dict[str, np.ndarray]:
    """The inverse of `params_from_tensors`: checkpoint name -> array in the checkpoint's layout."""
    t = {"wte.weight": params.wte, "wpe.weight": params.wpe,
         "ln_f.weight": params.ln_f.weight, "ln_f.bias": params.ln_f.bias}
    for i, b in enumerate(params.h):
        for name, value in (
            ("ln_1", b.ln_1), ("attn.c_attn", b.attn.c_attn), ("attn.c_proj", b.attn.c_proj),
            ("ln_2", b.ln_2), ("mlp.c_fc", b.mlp.c_fc), ("mlp.c_proj", b.mlp.c_proj),
        ):
            t[f"h.{i}.{name}.weight"] = value.weight
            t[f"h.{i}.{name}.bias"] = value.bias
    return t


def random_params(config: GPT2Config, seed: int = 0, scale: float = 1.0) -> GPT2Params:
    """Deterministic random float32 weights drawn as Hugging Face initialises GPT-2 (N(0, 0.02)),
    `scale` multiplying all but the gains; biases and gains get a little noise so that every
    parameter matters in the parity tests."""
    rng = np.random.default_rng(seed)
    std = 0.02 * scale
    proj_std = std / math.sqrt(2 * config.n_layer)
    t = {}
    for name, shape in expected_shapes(config).items():
        noise = rng.standard_normal(shape, dtype=np.float32)
        if name.endswith("c_proj.weight"):
            t[name] = noise * np.float32(proj_std)
        elif name.endswith(".weight") and len(shape) == 1:  # LayerNorm gain
            t[name] = 1 + noise * np.float32(0.02)
        elif name.endswith(".bias"):
            t[name] = noise * np.float32(0.2 * std)
        else:
            t[name] = noise * np.float32(std)
    return params_from_tensors(config, t)
