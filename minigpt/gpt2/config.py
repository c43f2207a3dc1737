"""GPT-2's hyperparameters, under Hugging Face's field names, and the published model sizes."""

from __future__ import annotations

from dataclasses import dataclass

GPT2_VOCAB_SIZE = 50257  # 50,000 merges + 256 bytes + <|endoftext|>


@dataclass(frozen=True)
class GPT2Config:
    """The numbers that fix every tensor shape; the defaults are GPT-2 small (124M)."""

    vocab_size: int = GPT2_VOCAB_SIZE
    n_positions: int = 1024  # the context: positions the model has embeddings for
    n_embd: int = 768  # C, the width of every position's hidden state
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5
    eos_token_id: int | None = 50256  # <|endoftext|>; None: the vocabulary has none

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


# The published checkpoints' shapes (their config.json files), for cost arithmetic and random models.
GPT2_SIZES = {
    "gpt2": GPT2Config(n_layer=12, n_embd=768, n_head=12),
    "gpt2-medium": GPT2Config(n_layer=24, n_embd=1024, n_head=16),
    "gpt2-large": GPT2Config(n_layer=36, n_embd=1280, n_head=20),
    "gpt2-xl": GPT2Config(n_layer=48, n_embd=1600, n_head=25),
    "distilgpt2": GPT2Config(n_layer=6, n_embd=768, n_head=12),
}
