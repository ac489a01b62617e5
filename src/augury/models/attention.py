"""Attention pieces of the decoder: rotary tables, which keys each row sees, and the attention call.

Split from decoder.py so the layer code reads as a layer; the native stack
(native_layers.py) uses the same rotary tables and key sets.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor


class RopeConfig(Protocol):
    """What a rotary table reads of a ModelConfig (a protocol, so this module need not import the decoder's)."""

    head_dim: int
    rope_theta: float
    rope_freq_factors: tuple[float, ...] | None
    rope_attn_factor: float


def softcap(x: Tensor, cap: float | None) -> Tensor:
    """cap * tanh(x / cap) (Gemma 2's attention and final-logit soft-capping); x itself when cap is None."""
    return x if cap is None else torch.tanh(x / cap) * cap


def attend(
    q: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None, scale: float, cap: float | None
) -> Tensor:
    """Scaled dot-product attention. q: [B, H, T, D]; keys, values: [B, H_kv, S, D]; mask: [B, 1, T, S] bool or None.

    Without a soft-cap this is torch's fused call (GQA folded in). A soft-cap
    goes between the scaled scores and the softmax, which the fused call has
    no hook for, so those models take the plain matmul-softmax-matmul here
    (as transformers' Gemma 2 does: it has no SDPA path either).
    """
    if cap is None:
        return F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != keys.shape[1]
        )
    group = q.shape[1] // keys.shape[1]
    if group > 1:
        keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
    scores = softcap(torch.matmul(q, keys.transpose(-1, -2)) * scale, cap)  # [B, H, T, S]
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(values.dtype)
    return torch.matmul(probs, values)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding, half-split layout. x: [B, H, T, D]; cos, sin: [B, 1, T, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RopeTable:
    """cos/sin for positions 0..n-1, grown on demand, in the model dtype.

    A scaled RoPE (Llama 3.x, linear, Phi-3's longrope) only changes the frequencies and, for
    longrope, multiplies cos and sin by an attention factor (so q.k by its square, as transformers
    does); every user of the table (the torch layer, and the C++ layer fed from an fp32 table)
    gets the scaling for free.
    """

    def __init__(
        self,
        head_dim: int,
        theta: float,
        dtype: torch.dtype,
        device: torch.device,
        factors: tuple[float, ...] | None = None,
        attn_factor: float = 1.0,
    ) -> None:
        """factors: [D / 2] divisors of the rotary frequencies (linear, llama3 or longrope; None: unscaled).
        attn_factor: what cos and sin are multiplied by (longrope's; 1 otherwise)."""
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
        if factors is not None:
            self.inv_freq = self.inv_freq / torch.tensor(factors, dtype=torch.float32, device=device)
        self.attn_factor = attn_factor
        self.dtype = dtype
        self.cos = torch.empty(0, head_dim, dtype=dtype, device=device)
        self.sin = self.cos

    @classmethod
    def scaled(cls, config: RopeConfig, dtype: torch.dtype, device: torch.device) -> RopeTable:
        """The global (full-attention) table of a model, with its RoPE scaling; one home for both decoders."""
        return cls(config.head_dim, config.rope_theta, dtype, device, config.rope_freq_factors,
                   config.rope_attn_factor)

    def lookup(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """positions: [B, T] -> cos, sin: [B, 1, T, D]."""
        needed = int(positions.max()) + 1
        if needed > self.cos.shape[0]:
            size = max(needed, 2 * self.cos.shape[0], 256)
            t = torch.arange(size, dtype=torch.float32, device=self.inv_freq.device)
            freqs = torch.outer(t, self.inv_freq)
            angles = torch.cat((freqs, freqs), dim=-1)
            scale = self.attn_factor  # in fp32, before the cast, as transformers scales them
            self.cos, self.sin = (angles.cos() * scale).to(self.dtype), (angles.sin() * scale).to(self.dtype)
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)




def row_key_sets(
    lengths: list[int],
    positions: Tensor,
    block_mask: Tensor | None,
    *,
    window: int | None,
) -> list[tuple[int, int, slice | Tensor]]:
    """For each block row: (sequence, row, the cache slots it attends to).

    A chain row sees a contiguous slot range (a slice: no copy); a tree row sees
    the prefix plus its ancestors (an index tensor). Slot j of the prefix holds
    position j, so the sliding window is applied on slots for the prefix.
    """
    batch, t = positions.shape
    rows = []
    for b, start in enumerate(lengths):
        for i in range(t):
            if block_mask is None:
                end = start + i + 1
                lo = 0 if window is None else max(0, int(positions[b, i]) + 1 - window)
                rows.append((b, i, slice(min(lo, end - 1), end)))
                continue
            row_mask = block_mask[b, i] if block_mask.dim() == 3 else block_mask[i]
            block_slots = start + torch.nonzero(row_mask[:t]).flatten()
            key_pos = torch.cat([torch.arange(start), positions[b, row_mask[:t]]])
            slots = torch.cat([torch.arange(start), block_slots])
            if window is not None:
                slots = slots[int(positions[b, i]) - key_pos < window]
            rows.append((b, i, slots))
    return rows



def attention_mask(
    lengths: list[int],
    positions: Tensor,
    total: int,
    block_mask: Tensor | None,
    *,
    window: int | None,
) -> Tensor:
    """Boolean mask [B, 1, T, total]: which cache slots each new token attends to.

    lengths: cached prefix length per sequence (before this block).
    positions: [B, T] positions of the block tokens, written at slots
        lengths[b] .. lengths[b] + T - 1.
    block_mask: [B, T, T] / [T, T] visibility inside the block (default causal).
    window: sliding-window size; a key is visible only if q_pos - k_pos < window.
    """
    batch, t = positions.shape
    device = positions.device
    slot = torch.arange(total, device=device)  # [S]
    start = torch.tensor(lengths, device=device).unsqueeze(1)  # [B, 1]
    in_prefix = slot < start  # [B, S]
    block_index = slot - start  # [B, S]
    in_block = (block_index >= 0) & (block_index < t)
    block_index = block_index.clamp(0, t - 1)
    if block_mask is None:
        block_mask = torch.ones(t, t, dtype=torch.bool, device=device).tril()
    block_mask = block_mask.expand(batch, t, t)
    sees_block = torch.gather(block_mask, 2, block_index.unsqueeze(1).expand(batch, t, total))
    visible = in_prefix.unsqueeze(1) | (sees_block & in_block.unsqueeze(1))  # [B, T, S]
    if window is not None:
        key_pos = torch.where(in_block, torch.gather(positions, 1, block_index), slot)
        visible = visible & ((positions.unsqueeze(2) - key_pos.unsqueeze(1)) < window)
    return visible.unsqueeze(1)
