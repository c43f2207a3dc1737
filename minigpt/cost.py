"""What generating costs, by arithmetic alone: tokens pushed through the model, FLOPs, KV-cache bytes.

Nothing is loaded or timed here; `minigpt.staircase` measures what this predicts (docs/staircase.md).
For a prompt of P tokens and a reply of N tokens:

- The naive loop runs step n (n = 0 .. N-1) over all P + n positions so far:
  P*N + N*(N-1)/2 tokens pushed through the model, growing like N^2.
- The KV-cache loop pushes each position through once: P + N tokens. (This is the lesson's count;
  `minigpt.generate` feeds P + N - 1, since the last new token is never fed back. The difference
  is one token.)

FLOPs are an approximation (a multiply-add is 2 FLOPs). A forward over positions start .. L-1 costs
    2 * n_layer * block_params * (L - start)          every weight matrix of every block, per position
  + 4 * n_layer * attn_width * sum over t of (t + 1)   q.k scores and the weighted sum of values,
                                                       over the t + 1 keys position t sees
  + 2 * n_embd * vocab_size                            the LM head, on the last position only
                                                       (minigpt's `last_only`)
LayerNorm, GELU, softmax, biases and embedding lookups are left out: each is hundreds of times
smaller than the term above it that it accompanies (e.g. GELU's ~10 FLOPs per hidden unit against
the MLP's 2 x 4C x C per position).
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import GPT2_SIZES, GPT2Config
from .errors import InputError

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Architecture:
    """The numbers cost arithmetic needs from a decoder-only transformer."""

    name: str
    n_layer: int
    n_embd: int
    n_head: int  # query heads
    n_kv_heads: int  # heads whose keys and values are cached (fewer than n_head: grouped-query attention)
    head_dim: int
    block_params: int  # weight-matrix parameters in one block (attention + MLP); biases and norms left out
    vocab_size: int
    n_positions: int  # the context it was trained for
    dtype: str  # the dtype it runs in by default: minigpt's float32, or the published weights'

    @property
    def attn_width(self) -> int:
        return self.n_head * self.head_dim

    @property
    def matrix_params(self) -> int:
        """Every weight matrix read to decode one token: all blocks plus the LM head."""
        return self.n_layer * self.block_params + self.vocab_size * self.n_embd


def gpt2_architecture(name: str, config: GPT2Config) -> Architecture:
    """GPT-2 in minigpt: attention c_attn [C, 3C] + c_proj [C, C], MLP [C, 4C] + [4C, C], tied LM head."""
    C = config.n_embd
    return Architecture(name, config.n_layer, C, config.n_head, config.n_head, config.head_dim,
                        block_params=12 * C * C, vocab_size=config.vocab_size,
                        n_positions=config.n_positions, dtype="float32")


LLAMA_3_8B = Architecture(
    "llama-3-8b", n_layer=32, n_embd=4096, n_head=32, n_kv_heads=8, head_dim=128,
    # q and o [4096, 4096], k and v [4096, 8 * 128], SwiGLU MLP: gate, up, down [4096, 14336]
    block_params=2 * 4096 * 4096 + 2 * 4096 * 8 * 128 + 3 * 4096 * 14336,
    vocab_size=128256, n_positions=8192, dtype="bfloat16",
)
ARCHITECTURES = {**{name: gpt2_architecture(name, c) for name, c in GPT2_SIZES.items()}, LLAMA_3_8B.name: LLAMA_3_8B}


@dataclass(frozen=True)
class Cost:
    """The arithmetic for one request: P prompt tokens, N new tokens, KV cache in `dtype`."""

    arch: Architecture
    prompt: int
    reply: int
    dtype: str
    naive_tokens: int
    cached_tokens: int
    naive_flops: int
    cached_flops: int
    kv_bytes_per_token: int
    kv_bytes_total: int  # the whole sequence, P + N positions
    weight_bytes_per_token: int  # every weight matrix read once per decoded token, in `dtype`

    @property
    def ratio(self) -> float:
        return self.naive_tokens / self.cached_tokens

    @property
    def flop_ratio(self) -> float:
        return self.naive_flops / self.cached_flops

    @property
    def fits_context(self) -> bool:
        return self.prompt + self.reply <= self.arch.n_positions


def naive_tokens(prompt: int, reply: int) -> int:
    return prompt * reply + reply * (reply - 1) // 2


def cached_tokens(prompt: int, reply: int) -> int:
    return prompt + reply


def _flops(arch: Architecture, positions: int, keys_seen: int, lm_heads: int) -> int:
    """The module docstring's formula, summed over a whole loop."""
    return (2 * arch.n_layer * arch.block_params * positions
            + 4 * arch.n_layer * arch.attn_width * keys_seen
            + 2 * arch.n_embd * arch.vocab_size * lm_heads)


def _triangular(m: int) -> int:
    """1 + 2 + ... + m: the keys seen by all positions of an m-token forward."""
    return m * (m + 1) // 2


def _tetrahedral(m: int) -> int:
    """1 + 3 + 6 + ... + m(m+1)/2: the keys seen by the forwards over 1, 2, ..., m positions."""
    return m * (m + 1) * (m + 2) // 6


def naive_flops(arch: Architecture, prompt: int, reply: int) -> int:
    """Step n = 0 .. N-1 is a full forward over P + n positions; summed in closed form."""
    keys_seen = _tetrahedral(prompt + reply - 1) - _tetrahedral(prompt - 1)
    return _flops(arch, naive_tokens(prompt, reply), keys_seen, reply)


def cached_flops(arch: Architecture, prompt: int, reply: int) -> int:
    """Every position once (the prefill, then one per step); the LM head once per new token."""
    return _flops(arch, cached_tokens(prompt, reply), _triangular(prompt + reply), reply)


def kv_bytes_per_token(arch: Architecture, dtype: str) -> int:
    """Keys and values of every layer for one position: 2 * n_layer * n_kv_heads * head_dim * bytes."""
    return 2 * arch.n_layer * arch.n_kv_heads * arch.head_dim * DTYPE_BYTES[dtype]


def estimate(arch: Architecture, prompt: int, reply: int, dtype: str | None = None) -> Cost:
    """All of the above for one request; `dtype` defaults to the architecture's own."""
    for name, value in (("prompt", prompt), ("reply", reply)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{name} must be a positive number of tokens, got {value!r}")
    dtype = arch.dtype if dtype is None else dtype
    if dtype not in DTYPE_BYTES:
        raise InputError(f"dtype must be one of {', '.join(DTYPE_BYTES)}, got {dtype!r}")
    per_token = kv_bytes_per_token(arch, dtype)
    return Cost(arch, prompt, reply, dtype,
                naive_tokens(prompt, reply), cached_tokens(prompt, reply),
                naive_flops(arch, prompt, reply), cached_flops(arch, prompt, reply),
                per_token, per_token * (prompt + reply), arch.matrix_params * DTYPE_BYTES[dtype])
