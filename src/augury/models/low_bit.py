"""Low-bit copies of a decoder's matmul weights, for drafters: int4 and int8 in torch, GGUF blocks re-quantized.

A drafter's guesses are verified by the target, so its weights may be lossy:
decoding one token is bound by reading the weights, and a copy that reads
fewer bytes drafts faster while staying close enough to be accepted. Only the
four matmul weights of each layer (wqkv, wo, w_gate_up, w_down) and lm_head
change; tokenizer, embeddings, norms and biases are shared.

- `Int4Weight`, `Int8Weight` (`quantize_decoder`): torch's
  `_weight_int4pack_mm_for_cpu` (groups of 32: a quarter of bf16's bytes) and
  `_weight_int8pack_mm` (one scale per output channel: half). Where int4 does
  not run (GPUs) int8 is used; where the int8 kernel is missing the fallback
  dequantizes on the fly, correct but slower than bf16. Quantizing takes tens
  of seconds for 1.5B parameters at start-up; it is not cached.
- `requantize_decoder`: a GGUF drafter's wider blocks (Q8_0, Q5_x, Q6_K) as
  Q4_0 on the same kernel and C++ layer.

Measured speeds are in docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import Tensor

from augury.errors import AuguryError
from augury.models.decoder import LINEAR_FIELDS, Decoder, PackedWeight, Weights, dense_weight, linear
from augury.proposers.options import QUANT_FORMATS

_ROWS_PER_CHUNK = 8192  # quantize big matrices (lm_head) in row chunks to bound the fp32 scratch memory
# Above this many rows (a prompt's prefill) the int8 kernel loses to the dense
# bf16 GEMM, which is compute-bound there; decode steps stay below it.
DENSE_ROWS = 16


def int8_matmul_available(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether torch's fused int8-weight matmul runs here for this activation dtype (checked on a tiny case)."""
    if not hasattr(torch, "_weight_int8pack_mm"):
        return False
    x = torch.ones(2, 32, dtype=dtype, device=device)
    weight = torch.ones(8, 32, dtype=torch.int8, device=device)
    scale = torch.full((8,), 0.5, dtype=dtype, device=device)
    try:
        out = torch._weight_int8pack_mm(x, weight, scale)
    except (RuntimeError, NotImplementedError):
        return False
    return bool(torch.allclose(out.float(), torch.full((2, 8), 16.0, device=device)))


class _LowBitWeight:
    """What Int8Weight and Int4Weight share: the decoder's packed-weight protocol
    (`linear`), so the decoder's own forward runs on them unchanged, with
    prefill-sized inputs sent to the original weight (kept by reference)."""

    original: Tensor | PackedWeight | None

    def _matmul(self, flat: Tensor) -> Tensor:
        """flat: [N, in] -> [N, out] through the low-bit kernel."""
        raise NotImplementedError

    def linear(self, x: Tensor, bias: Tensor | None) -> Tensor:
        """x: [..., in] -> [..., out]."""
        flat = x.reshape(-1, x.shape[-1])
        if self.original is not None and flat.shape[0] > DENSE_ROWS:
            return linear(x, self.original, bias)
        out = self._matmul(flat.contiguous())
        if bias is not None:
            out = out + bias
        return out.view(*x.shape[:-1], out.shape[-1])


class Int8Weight(_LowBitWeight):
    """A [out, in] weight as int8 values and one scale per output row: weight ~= values * scale[:, None]."""

    def __init__(self, weight: Tensor | PackedWeight, *, fused: bool, keep_original: bool = True) -> None:
        # The original weight (shared, not copied), for prefill-sized inputs.
        self.original = weight if keep_original else None
        values, scales = [], []
        for rows in dense_weight(weight).split(_ROWS_PER_CHUNK):
            scale = rows.abs().amax(dim=1).float() / 127.0  # abs and max are exact in any float dtype
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
            # A copy: for fp32 weights .float() would return the target's own tensor, divided in place.
            scaled = rows.to(torch.float32, copy=True).div_(scale[:, None])
            values.append(scaled.round_().clamp_(-127, 127).to(torch.int8))
            scales.append(scale)
        self.values = torch.cat(values)  # [out, in] int8
        self.scale = torch.cat(scales).to(weight.dtype)  # [out], in the activation dtype (the kernel wants that)
        self.fused = fused
        self.shape = weight.shape

    def __getitem__(self, rows: slice) -> "Int8Weight":
        """The first rows of the weight (a drafter's truncated output head), sharing storage."""
        part = Int8Weight.__new__(Int8Weight)
        part.values, part.scale, part.fused = self.values[rows], self.scale[rows], self.fused
        part.original = None if self.original is None else self.original[rows]
        part.shape = part.values.shape
        return part

    def dense(self) -> Tensor:
        """The weight this stands for, [out, in] in the activation dtype (tests and the fallback)."""
        return self.values.to(self.scale.dtype) * self.scale[:, None]

    def _matmul(self, flat: Tensor) -> Tensor:
        if self.fused:
            return torch._weight_int8pack_mm(flat, self.values, self.scale)
        return F.linear(flat, self.values.to(flat.dtype)) * self.scale


class Int4Weight(_LowBitWeight):
    """A [out, in] weight as 4-bit values in groups of `group` inputs, each group with its own scale and offset.

    weight ~= (values - 8) * scale + offset per group. Half the bytes of int8,
    and torch's CPU kernel (`_weight_int4pack_mm_for_cpu`) decodes one row
    1.8-2.6x faster than the int8 one on the 0.5B drafter's matrices here (a
    micro-benchmark). The GGUF draft model was 4-bit (Q4_K_M, 32-input blocks)
    to begin with, so 32-input groups lose little more.
    """

    ROW_BLOCK = 16  # the kernel takes output rows in blocks of 16: padded with zero rows, cut after

    def __init__(self, weight: Tensor | PackedWeight, *, group: int = 32, keep_original: bool = True) -> None:
        self.original = weight if keep_original else None
        self.group = group
        self.rows = weight.shape[0]
        dense = dense_weight(weight)
        pad = -self.rows % self.ROW_BLOCK
        if pad:
            dense = torch.cat([dense, dense.new_zeros(pad, dense.shape[1])])
        packed, scales_offsets = [], []
        for rows in dense.split(_ROWS_PER_CHUNK):
            n, k = rows.shape
            blocks = rows.float().reshape(n, k // group, group)
            low, high = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
            scale = ((high - low) / 15).clamp(min=1e-8)
            values = ((blocks - low) / scale).round_().clamp_(0, 15).reshape(n, k).to(torch.int32)
            packed.append(torch._convert_weight_to_int4pack_for_cpu(values, 1))  # [n, k / 2] uint8
            offset = low + 8 * scale  # the value that 4-bit value 8 stands for
            scales_offsets.append(torch.cat([scale, offset], -1).transpose(0, 1))  # [k / group, n, 2]
        self.packed = torch.cat(packed)
        self.scales_offsets = torch.cat(scales_offsets, dim=1).to(weight.dtype).contiguous()
        self.shape = weight.shape

    def __getitem__(self, rows: slice) -> "Int4Weight":
        """Some rows of the weight (a drafter's truncated output head), quantized anew.

        The kernel's packed layout interleaves rows, so the rows' dequantized
        values are packed again; their group grids reproduce themselves.
        """
        part = Int4Weight(self.dense()[rows], group=self.group, keep_original=False)
        part.original = None if self.original is None else self.original[rows]
        return part

    def dense(self) -> Tensor:
        """The weight this stands for (rounded to the activation dtype), [out, in]."""
        eye = torch.eye(self.shape[1], dtype=self.scales_offsets.dtype)
        out = torch._weight_int4pack_mm_for_cpu(eye, self.packed, self.group, self.scales_offsets)
        return out[:, : self.rows].t().contiguous()

    def _matmul(self, flat: Tensor) -> Tensor:
        out = torch._weight_int4pack_mm_for_cpu(flat, self.packed, self.group, self.scales_offsets)
        return out[:, : self.rows]  # drop the padding rows


def int4_matmul_available(dtype: torch.dtype, device: torch.device, group: int = 32) -> bool:
    """Whether torch's CPU int4 kernel runs here for activations of this dtype on this device (a tiny case)."""
    if device.type != "cpu" or not hasattr(torch, "_weight_int4pack_mm_for_cpu"):
        return False
    try:
        Int4Weight(torch.ones(8, group, dtype=dtype), keep_original=False).linear(torch.ones(1, group, dtype=dtype), None)
    except (RuntimeError, NotImplementedError):
        return False
    return True


def low_bit_weight(weight: Tensor | PackedWeight, fmt: str, *, fused: bool) -> Int8Weight | Int4Weight:
    """One matmul weight as `fmt` ("int8" or "int4"; int4 where it runs): int4 groups span 32 inputs, so a
    matrix whose width is no multiple of that stays int8. The original is kept for prefill-sized inputs."""
    if fmt == "int4" and weight.shape[1] % 32 == 0:
        return Int4Weight(weight)
    return Int8Weight(weight, fused=fused)


def quantize_decoder(decoder: Decoder, fused: bool | None = None, fmt: str = "int8") -> Decoder:
    """A low-precision copy of a decoder's linears ("int8" or "int4"), sharing every other tensor with it.

    fused (int8): use torch's int8 matmul kernel (default: if it runs here), else dequantize on the fly.
    """
    if fmt not in QUANT_FORMATS:
        raise AuguryError(f"unknown weight format '{fmt}' (choose from {', '.join(QUANT_FORMATS)})")
    if fmt == "int4" and not int4_matmul_available(decoder.dtype, decoder.device):
        raise AuguryError("int4 weights need torch's CPU int4 kernel (a CPU device); use int8")
    if fused is None:
        fused = int8_matmul_available(decoder.dtype, decoder.device)
    return _drafter_copy(decoder, lambda weight: low_bit_weight(weight, fmt, fused=fused))


def requantize_decoder(decoder: Decoder, kind: str) -> Decoder:
    """A copy of a GGUF decoder whose matmul weights wider than `kind` are re-quantized to it (the others,
    norms and embeddings shared): a drafter that reads fewer bytes per step, its guesses checked by the
    target (a small GGUF often keeps its output head in Q8_0: docs/benchmarks.md 9c)."""
    from augury.kernels.reference import bits
    from augury.kernels.weight import GgufWeight

    def make(weight):
        if isinstance(weight, GgufWeight) and weight.bits_per_value() > bits(kind) and weight.shape[1] % 32 == 0:
            return weight.requantized(kind)
        return weight

    return _drafter_copy(decoder, make)


def _drafter_copy(decoder: Decoder, make) -> Decoder:
    """The decoder with `make` applied to its four matmul weights per layer and lm_head, the rest shared.
    A drafter needs no batch invariance (the target verifies), so no row padding. A head restricted to some
    token ids (`Decoder.with_head_rows`) stays restricted: only its rows are converted."""
    w = decoder.weights
    layers = [
        dataclasses.replace(layer, **{name: make(getattr(layer, name)) for name in LINEAR_FIELDS})
        for layer in w.layers
    ]
    weights = Weights(embed=w.embed, final_norm=w.final_norm, lm_head=make(w.lm_head), layers=layers)
    copy = Decoder(decoder.config, weights, exact=False)
    copy.head_ids = decoder.head_ids
    return copy
