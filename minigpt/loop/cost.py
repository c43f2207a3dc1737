"""What generating costs, by arithmetic alone: tokens pushed through the model, FLOPs, KV-cache bytes.

Nothing is loaded or timed here; `minigpt.loop.staircase` measures what this predicts. The counting
rule, the FLOP formula and what it leaves out are in docs/staircase.md.

Source: Inference Engineering (fanout.sh, inference-eng), lesson 03-01, "Why Autoregressive Generation Recomputes Work".
"""

from __future__ import annotations

from dataclasses import dataclass

from ..gpt2.config import GPT2_SIZES, GPT2Config

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}  # bytes per number of the dtypes weights come in


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
    """GPT-2: per block c_attn (C -> 3C), c_proj (C -> C) and the MLP (C -> 4C -> C), 12 C*C weights; tied LM head."""
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
    kv_bytes_total: int  # every position the cache holds: the cached_tokens fed
    weight_bytes_per_token: int  # every weight matrix read once per decoded token, in `dtype`

    @property
    def ratio(self) -> float:
        return self.naive_tokens / self.cached_tokens

    @property
    def flop_ratio(self) -> float:
        return self.naive_flops / self.cached_flops

    @property
    def fits_context(self) -> bool:
        """The P + N - 1 positions the cached loop feeds fit in the context (the last token is never fed)."""
        return self.cached_tokens <= self.arch.n_positions


def token_counts(prompt: int, reply: int) -> tuple[int, int]:
    """Tokens pushed through the model for P prompt tokens and N >= 1 new ones: (naive loop,
    KV-cache loop), P*N + N(N-1)/2 and P + N - 1 (docs/staircase.md)."""
    return prompt * reply + reply * (reply - 1) // 2, prompt + reply - 1


def _flops(arch: Architecture, positions: int, keys_seen: int, lm_heads: int) -> int:
    """docs/staircase.md's FLOP estimate for forwards over `positions` rows in all, seeing `keys_seen` keys."""
    return (2 * arch.n_layer * arch.block_params * positions  # every block weight matrix, per position
            + 4 * arch.n_layer * arch.attn_width * keys_seen  # q.k and the weighted sum of v, per key seen
            + 2 * arch.n_embd * arch.vocab_size * lm_heads)  # the LM head, on the last position only


def _triangular(m: int) -> int:
    """1 + 2 + ... + m: the keys seen by all positions of an m-token forward."""
    return m * (m + 1) // 2


def _tetrahedral(m: int) -> int:
    """1 + 3 + 6 + ... + m(m+1)/2: the keys seen by the forwards over 1, 2, ..., m positions."""
    return m * (m + 1) * (m + 2) // 6


def naive_flops(arch: Architecture, prompt: int, reply: int) -> int:
    """Step n = 0 .. N-1 is a full forward over P + n positions; summed in closed form."""
    keys_seen = _tetrahedral(prompt + reply - 1) - _tetrahedral(prompt - 1)
    return _flops(arch, token_counts(prompt, reply)[0], keys_seen, reply)


def cached_flops(arch: Architecture, prompt: int, reply: int) -> int:
    """Every position fed once (the prefill, then one per step), position t seeing t + 1 keys; the LM
    head once per new token."""
    positions = token_counts(prompt, reply)[1]
    return _flops(arch, positions, _triangular(positions), reply)


def kv_bytes_per_token(arch: Architecture, dtype: str | None = None) -> int:
    """Keys and values of every layer for one position: 2 * n_layer * n_kv_heads * head_dim * bytes,
    in `dtype` (default: the architecture's own)."""
    return 2 * arch.n_layer * arch.n_kv_heads * arch.head_dim * DTYPE_BYTES[dtype or arch.dtype]


MAX_TOKENS = 10 ** 15  # beyond any context; above it the ratios can overflow float64 (a reply of 10**400 does)


def estimate(arch: Architecture, prompt: int, reply: int, dtype: str | None = None) -> Cost:
    """All of the above for one request, prompt and reply in 1 .. MAX_TOKENS (the command line checks
    them); `dtype` (a key of DTYPE_BYTES) defaults to the architecture's own."""
    dtype = arch.dtype if dtype is None else dtype
    per_token = kv_bytes_per_token(arch, dtype)
    naive, cached = token_counts(prompt, reply)
    return Cost(arch, prompt, reply, dtype, naive, cached,
                naive_flops(arch, prompt, reply), cached_flops(arch, prompt, reply),
                per_token, per_token * cached, arch.matrix_params * DTYPE_BYTES[dtype])
