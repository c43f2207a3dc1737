"""The GPT-2 hyperparameters, under Hugging Face's field names, and the published model sizes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import ConfigError, check_int


@dataclass(frozen=True)
class GPT2Config:
    """The numbers that fix every tensor shape; the defaults are GPT-2 small (124M)."""

    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5
    eos_token_id: int | None = 50256  # None: the vocabulary has no <|endoftext|>

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            check_int(getattr(self, name), f"config field {name!r}", 1, ConfigError)
        if self.n_embd % self.n_head:
            raise ConfigError(
                f"config field 'n_embd' ({self.n_embd}) must be divisible by 'n_head' ({self.n_head})"
            )
        eps = self.layer_norm_epsilon
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
            raise ConfigError(f"config field 'layer_norm_epsilon' must be a number in (0, 1), got {eps!r}")
        eos = self.eos_token_id
        if eos is not None and check_int(eos, "config field 'eos_token_id'", 0, ConfigError) >= self.vocab_size:
            raise ConfigError(
                f"config field 'eos_token_id' must be an integer in [0, {self.vocab_size}), got {eos!r}"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


# Activations that are GPT-2's tanh-approximated GELU under their Hugging Face names.
TANH_GELU_NAMES = ("gelu_new", "gelu_pytorch_tanh")


def config_from_dict(d: object, source: str = "config.json") -> GPT2Config:
    """Read a Hugging Face GPT-2 config.json (already parsed); reject fields that change the math."""
    if not isinstance(d, dict):
        raise ConfigError(f"{source}: expected a JSON object, got {type(d).__name__}")
    model_type = d.get("model_type", "gpt2")
    if model_type != "gpt2":
        raise ConfigError(f"{source}: field 'model_type' is {model_type!r}; minigpt runs GPT-2 ('gpt2') only")
    activation = d.get("activation_function", "gelu_new")
    if activation not in TANH_GELU_NAMES:
        raise ConfigError(
            f"{source}: field 'activation_function' is {activation!r}; GPT-2 uses {TANH_GELU_NAMES[0]!r}"
        )
    n_inner, n_embd = d.get("n_inner"), d.get("n_embd")
    if n_inner is not None and not (isinstance(n_embd, int) and n_inner == 4 * n_embd):
        raise ConfigError(f"{source}: field 'n_inner' is {n_inner!r}; GPT-2's MLP is 4 * n_embd wide (null)")
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
        if d.get(flag):
            raise ConfigError(f"{source}: field {flag!r} is set; minigpt implements the original GPT-2 only")
    if d.get("scale_attn_weights") is False:
        raise ConfigError(f"{source}: field 'scale_attn_weights' is false; GPT-2 scales by 1/sqrt(head_dim)")
    fields = {}
    for field in dataclasses.fields(GPT2Config):
        key = field.name
        if key == "n_positions" and key not in d and "n_ctx" in d:
            key = "n_ctx"  # the oldest GPT-2 configs call it n_ctx
        if key in d:
            fields[field.name] = d[key]
        elif field.name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            raise ConfigError(f"{source}: missing field {field.name!r}")
    eos, vocab = fields.get("eos_token_id"), fields.get("vocab_size")
    if isinstance(eos, int) and isinstance(vocab, int) and eos >= vocab:
        fields["eos_token_id"] = None  # transformers' default 50256 in a smaller test vocabulary: no such token
    try:
        return GPT2Config(**fields)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def config_to_dict(config: GPT2Config) -> dict:
    """The config.json Hugging Face writes for this config (fields transformers needs to load it)."""
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "vocab_size": config.vocab_size,
        "n_positions": config.n_positions,
        "n_ctx": config.n_positions,
        "n_embd": config.n_embd,
        "n_layer": config.n_layer,
        "n_head": config.n_head,
        "n_inner": None,
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "bos_token_id": config.eos_token_id,
        "eos_token_id": config.eos_token_id,  # null when the vocabulary has no <|endoftext|>
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "tie_word_embeddings": True,
    }


# The published checkpoints' shapes (their config.json files), for cost arithmetic and random models.
GPT2_SIZES = {
    "gpt2": GPT2Config(n_layer=12, n_embd=768, n_head=12),
    "gpt2-medium": GPT2Config(n_layer=24, n_embd=1024, n_head=16),
    "gpt2-large": GPT2Config(n_layer=36, n_embd=1280, n_head=20),
    "gpt2-xl": GPT2Config(n_layer=48, n_embd=1600, n_head=25),
    "distilgpt2": GPT2Config(n_layer=6, n_embd=768, n_head=12),
}
