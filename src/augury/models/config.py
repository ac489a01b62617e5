"""What one decoder is made of, as data: its shape and switches (`ModelConfig`) and its weights.

Apart from decoder.py so that the modules the decoder uses (the C++ layer stack,
the loaders) can name these types without importing the decoder itself.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Protocol

import torch
from torch import Tensor


@dataclass(frozen=True)
class ModelConfig:
    """Shape and switches of one decoder; everything the forward needs to know."""

    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    context_length: int = 4096
    qkv_bias: bool = False  # qwen2
    qk_norm: bool = False  # qwen3, gemma3: RMSNorm over each head of q and k
    post_norms: bool = False  # gemma2/3: norms after attention and after the MLP
    embed_scale: float = 1.0  # gemma: sqrt(hidden_size)
    activation: str = "silu"  # "silu" or "gelu_tanh"
    tie_embeddings: bool = False
    # Sliding-window attention: with sliding_pattern p > 0 (gemma), layers whose
    # index % p != p - 1 attend to the last `sliding_window` positions only and
    # use the local rope base; with p = 0 every layer slides (mistral, phi-3).
    sliding_window: int | None = None
    sliding_pattern: int = 0
    rope_theta_local: float | None = None
    rope_freq_factors: tuple[float, ...] | None = None  # [head_dim / 2] divisors of the global rope's frequencies
    rope_attn_factor: float = 1.0  # longrope: the global rope's cos and sin are multiplied by it
    query_scale: float | None = None  # defaults to head_dim ** -0.5
    attn_softcap: float | None = None  # gemma2: scores -> cap * tanh(scores / cap) before the softmax
    final_softcap: float | None = None  # gemma2: the same on the output logits

    def __post_init__(self) -> None:  # a cached config.json reads the factors back as a list
        if isinstance(self.rope_freq_factors, list):
            object.__setattr__(self, "rope_freq_factors", tuple(self.rope_freq_factors))

    def is_sliding(self, layer: int) -> bool:
        if not self.sliding_window:
            return False
        if not self.sliding_pattern:
            return True
        return layer % self.sliding_pattern != self.sliding_pattern - 1

    def to_dict(self) -> dict:
        return asdict(self)


class PackedWeight(Protocol):
    """A weight stored in another format (e.g. int8 with per-row scales) that computes its own matmul."""

    shape: torch.Size  # [out, in]

    def linear(self, x: Tensor, bias: Tensor | None) -> Tensor:
        """x: [..., in] -> [..., out]."""

    def dense(self) -> Tensor:
        """The [out, in] weight this stands for, as a plain tensor."""


@dataclass
class LayerWeights:
    attn_norm: Tensor  # [hidden]
    wqkv: Tensor  # [(H + 2 H_kv) * D, hidden]
    wo: Tensor  # [hidden, H * D]
    mlp_norm: Tensor  # [hidden]
    w_gate_up: Tensor  # [2 * I, hidden]
    w_down: Tensor  # [hidden, I]
    bqkv: Tensor | None = None  # [(H + 2 H_kv) * D]
    q_norm: Tensor | None = None  # [D]
    k_norm: Tensor | None = None  # [D]
    post_attn_norm: Tensor | None = None  # [hidden]
    post_mlp_norm: Tensor | None = None  # [hidden]


@dataclass
class Weights:
    embed: Tensor  # [V, hidden]
    final_norm: Tensor  # [hidden]
    lm_head: Tensor  # [V, hidden]; the same tensor as embed when tied
    layers: list[LayerWeights] = field(default_factory=list)
