"""Q4_0 blocks from fp32 weights, for a drafter re-quantized at load (`--draft-quant q4_0`).

Q4_0 stores 32 values as one fp16 scale d and 4-bit quants q in 0..15, read as
d * (q - 8). ggml's reference quantizer (and the gguf package's) rounds to
nearest with d = m / -8, m the block's value of largest magnitude, so that m
lands on the one level, -8, that has no positive twin. `round_to_nearest` is
that quantizer, bit for bit, in torch: the reference the tests hold the gguf
package to, and the arm `fitted` was measured against.

`fitted` chooses each block's scale instead: it tries a grid of scales around
the reference one, rounds the block with each, and keeps the least-squares
scale of the rounding with the smallest squared error. A drafter's weights
are already a lossy copy (a 5-bit GGUF re-quantized to 4 bits); the better its
4-bit fit, the more of its guesses the target accepts (measured in
docs/benchmarks.md 35).
"""

from __future__ import annotations

import torch
from torch import Tensor

BLOCK = 32
# Grid of divisors c (d = m / c) `fitted` tries, the reference's -8 among them. Below -8 the block's largest
# value is clipped to -8 for a finer step over the rest; above, it lands on a coarser level. On the 0.5B
# drafter's Q5_0 and Q6_K weights (two layers) this grid left 0.702 of round to nearest's squared error;
# steps of 0.25 over the same span (0.125 around -8) 0.700, and 0.125 steps from -8.5 to -6.5 with the
# positive side (m on +7, which never won) 0.704, for two to three times the time.
FIT_DIVISORS = tuple(-10.0 + 0.5 * i for i in range(8))
# Rows quantized at once: bounds the temporaries of `fitted` (a few fp32 copies of the chunk).
CHUNK_VALUES = 1 << 22


def _blocks(w: Tensor) -> Tensor:
    """w: [out, in] -> [out * in / 32, 32] fp32, with a clear error for rows of partial blocks."""
    if w.dim() != 2 or w.shape[1] % BLOCK:
        raise ValueError(f"Q4_0 needs a 2-d matrix of rows of whole {BLOCK}-value blocks, got {tuple(w.shape)}")
    return w.float().reshape(-1, BLOCK)


def _signed_max(blocks: Tensor) -> Tensor:
    """[n, 32] -> [n, 1]: each block's value of largest magnitude, its sign kept (the first on a tie)."""
    return blocks.gather(1, blocks.abs().argmax(dim=1, keepdim=True))


def _pack(d: Tensor, q: Tensor) -> Tensor:
    """d: [n] fp32 scales, q: [n, 32] quants in 0..15 -> [n, 18] bytes: fp16 d, then the low nibbles hold
    values 0..15 and the high nibbles 16..31."""
    q = q.to(torch.uint8)
    nibbles = q[:, :16] | (q[:, 16:] << 4)
    return torch.cat([d.to(torch.float16).view(torch.uint8).reshape(-1, 2), nibbles], dim=1)


def round_to_nearest(w: Tensor) -> Tensor:
    """w: [out, in] fp32 -> [out, in / 32 * 18] uint8 Q4_0 blocks, bitwise what `gguf.quants.quantize` gives:
    d = m / -8, q = trunc(x / d + 8.5) clamped to 0..15 (x / d as x times the fp32 inverse of d)."""
    out = w.shape[0]
    blocks = _blocks(w)
    d = _signed_max(blocks) / -8.0
    inverse = torch.where(d == 0, torch.zeros_like(d), 1.0 / d)
    q = torch.trunc(blocks * inverse + 8.5).clamp(0, 15)
    return _pack(d.squeeze(1), q).reshape(out, -1)


def fitted(w: Tensor, kernel=None) -> Tensor:
    """w: [out, in] fp32 -> [out, in / 32 * 18] uint8 Q4_0 blocks, each block's scale fitted: for each divisor c
    in FIT_DIVISORS the block is rounded at d = m / c, the rounding's least-squares scale
    d* = sum(x q) / sum(q^2) is taken, and the c whose rounding leaves the least squared error keeps it.
    Never worse than `round_to_nearest` in squared error up to fp16's rounding of d (its divisor, -8, is
    on the grid).

    kernel: the C++ extension (`extension()`), whose `fit_q4_0` gives the same bytes in a fraction of
    the time (the 0.5B drafter: 2.5 s, where this code over a first grid of 25 divisors took 37-41 s,
    docs/benchmarks.md 35); None: this torch code, the reference."""
    out = w.shape[0]
    blocks = _blocks(w).contiguous()
    if kernel is not None:
        return kernel.fit_q4_0(blocks, list(FIT_DIVISORS)).reshape(out, -1)
    rows = max(1, CHUNK_VALUES // BLOCK)
    packed = [_fit_chunk(blocks[i : i + rows]) for i in range(0, blocks.shape[0], rows)]
    return torch.cat(packed).reshape(out, -1)


def _fit_chunk(x: Tensor) -> Tensor:
    """x: [n, 32] fp32 -> [n, 18] fitted Q4_0 blocks (see `fitted`). The rounding is fp32; the sums are
    fp64, where 32 products of a float by an integer of at most 8 add up exactly in any order, so that the
    kernel's loop and this code's reductions choose and scale alike, bit for bit."""
    m = _signed_max(x)  # [n, 1]
    x64 = x.double()
    best_gain = torch.full((x.shape[0],), -1.0, dtype=torch.float64)  # (sum x q)^2 / sum q^2
    best_d = torch.zeros_like(best_gain)
    best_q = torch.full(x.shape, 8.0)
    safe_m = torch.where(m == 0, torch.ones_like(m), m)
    for c in FIT_DIVISORS:
        scale = torch.full_like(safe_m, c) / safe_m  # fp32 c / m (a Python c / tensor is c * (1 / m) in torch)
        level = (x * scale).round().clamp(-8, 7)  # [n, 32] signed levels of the rounding at d = m / c
        level64 = level.double()
        xq = (x64 * level64).sum(1)
        qq = (level64 * level64).sum(1)
        gain = torch.where(qq > 0, xq * xq / qq.clamp(min=1.0), torch.zeros_like(qq))
        better = gain > best_gain
        best_gain = torch.where(better, gain, best_gain)
        best_d = torch.where(better, torch.where(qq > 0, xq / qq.clamp(min=1.0), torch.zeros_like(qq)), best_d)
        best_q = torch.where(better.unsqueeze(1), level + 8, best_q)
    best_d = torch.where(m.squeeze(1) == 0, torch.zeros_like(best_d), best_d)
    return _pack(best_d.float(), best_q)
