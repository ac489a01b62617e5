"""`GgufWeight`: a linear weight kept as its GGUF blocks, multiplied by the C++ kernel.

It implements the decoder's `PackedWeight` protocol, so the one decoder runs
on it unchanged. A weight may stack several parts with different block types
on the output axis (a fused qkv whose v rows are Q6_K while q and k are Q4_K,
as Q4_K_M files have it); one kernel call quantizes the activation rows once
and runs every part.

Where the extension cannot be built, the same object computes the kernel's
arithmetic with torch ops (`fallback_matmul`): the same quantized activations,
the same exact integer dot products, fp32 sums in the same sub-block order,
so its results agree with the kernel's within fp32 rounding (tests bound it),
and it is batch invariant too (every row's work is elementwise on its own
values). It decodes the blocks on every call, so it is slow: it exists so
that a machine without a compiler still runs, and says so once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

import torch
from torch import Tensor

from augury.kernels import packing, reference, requantize
from augury.kernels.extension import extension, has_matrix_unit, kernel_isa

# Blocks of more tokens per sequence than this are prefill: where the CPU has a bf16 matrix unit
# (AMX), their matmuls go through bf16 weights dequantized tile by tile and torch's (oneDNN's) bf16
# matmul, faster there than the int8 kernel on long blocks; without one (AVX-512 BF16 alone) the
# int8 kernel was the faster up to 1024 tokens and even with it at 2048 (docs/benchmarks.md 10, 16b).
# It equals the decoder's row attention limit: up to there the decoder keeps each row independent
# of its block (and so does the kernel); longer blocks attend batched and were never batch invariant.
PREFILL_ROWS = 64
# Output rows dequantized at a time on the prefill path (bounds the temporary bf16 weights).
PREFILL_CHUNK = 4096


@dataclass(frozen=True)
class Part:
    """`rows` output rows of one block type: repacked for the kernel, or the raw GGUF blocks for the fallback."""

    kind: str
    rows: int
    data: Tensor  # uint8: packing.pack's buffer (packed=True) or raw blocks [rows, row_bytes]
    packed: bool


class GgufWeight:
    """An [out, in] weight as GGUF blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K).

    Every activation row is computed on its own, in an order that does not
    depend on how many rows share the call, so a row's output is bitwise the
    same alone or in a block of any size (`invariant_rows` = 1).
    """

    invariant_rows = 1

    def __init__(
        self,
        parts: Sequence[tuple[str, Tensor]],
        *,
        dtype: torch.dtype = torch.bfloat16,
        kernel: ModuleType | None | bool = True,
    ) -> None:
        """parts: (block type, raw blocks [rows, row_bytes] uint8) stacked on the output axis, in order.

        kernel: True = the built extension where available; False = the torch
        fallback; or an extension module to use.
        """
        if not parts:
            raise ValueError("a GgufWeight needs at least one part")
        sizes = {reference.check_blocks(kind, raw) for kind, raw in parts}
        if len(sizes) != 1:
            raise ValueError(f"parts disagree on the input size: {sorted(sizes)}")
        (n_in,) = sizes
        self.kernel = extension() if kernel is True else (kernel or None)
        self.isa = _isa_of(self.kernel)
        self.dtype = dtype
        self.shape = torch.Size([sum(raw.shape[0] for _, raw in parts), n_in])  # [out, in]
        self.parts = [self._part(kind, raw) for kind, raw in parts]

    def _part(self, kind: str, raw: Tensor) -> Part:
        if self.kernel is None:
            return Part(kind, raw.shape[0], raw.contiguous(), packed=False)
        return Part(kind, raw.shape[0], packing.pack(reference.decode(kind, raw)), packed=True)

    @classmethod
    def from_packed(
        cls, parts: Sequence[tuple[str, int, Tensor]], n_in: int, *, dtype: torch.dtype = torch.bfloat16
    ) -> "GgufWeight":
        """A weight from buffers `packing.pack` wrote earlier ((block type, rows, buffer) per part); needs the kernel."""
        kernel = extension()
        if kernel is None:
            raise RuntimeError("packed GGUF buffers need the kernel extension")
        new = cls.__new__(cls)
        new.kernel, new.isa, new.dtype = kernel, _isa_of(kernel), dtype
        new.parts = [Part(kind, rows, data, packed=True) for kind, rows, data in parts]
        new.shape = torch.Size([sum(p.rows for p in new.parts), n_in])
        return new

    @classmethod
    def _from_parts(cls, parts: list[Part], like: "GgufWeight") -> "GgufWeight":
        new = cls.__new__(cls)
        new.kernel, new.isa, new.dtype, new.parts = like.kernel, like.isa, like.dtype, parts
        new.shape = torch.Size([sum(p.rows for p in parts), like.shape[1]])
        return new

    @property
    def nbytes(self) -> int:
        return sum(p.data.numel() for p in self.parts)

    @property
    def kinds(self) -> list[str]:
        return [p.kind for p in self.parts]

    def decoded(self) -> list[reference.Decoded]:
        """Each part in the reference's affine form (exact)."""
        out = []
        for p in self.parts:
            if p.packed:
                out.append(packing.unpack(p.data, p.kind, p.rows, self.shape[1]))
            else:
                out.append(reference.decode(p.kind, p.data))
        return out

    def linear(self, x: Tensor, bias: Tensor | None) -> Tensor:
        """x: [..., in] -> [..., out] in x's dtype; x: [B, T, in] with T > PREFILL_ROWS takes the bf16
        prefill path where the CPU has a matrix unit."""
        if x.dim() >= 3 and x.shape[-2] > PREFILL_ROWS and self._prefill_runs(x):
            return self._prefill(x, bias)
        flat = x.reshape(-1, self.shape[1]).contiguous()
        if self.kernel is not None:
            out = self.kernel.linear(
                flat,
                [p.data for p in self.parts],
                [packing.KIND_ID[p.kind] for p in self.parts],
                [p.rows for p in self.parts],
                bias,
                self.isa,
            )
        else:
            out = fallback_matmul(flat, self.decoded())
            if bias is not None:
                out = out + bias.float()
            out = out.to(x.dtype)
        return out.view(*x.shape[:-1], self.shape[0])

    def _dequantizer_runs(self) -> bool:
        return self.isa == "avx512"

    def _prefill_runs(self, x: Tensor) -> bool:
        return x.dtype == torch.bfloat16 and self._dequantizer_runs() and has_matrix_unit()

    def _prefill(self, x: Tensor, bias: Tensor | None) -> Tensor:
        """x @ W^T on bf16 weights dequantized chunk by chunk (see PREFILL_ROWS)."""
        flat = x.reshape(-1, self.shape[1])
        outs = []
        tiles = PREFILL_CHUNK // packing.TILE
        for p in self.parts:
            kind = packing.KIND_ID[p.kind]
            for t0 in range(0, -(-p.rows // packing.TILE), tiles):
                w = self.kernel.dequantize(p.data, kind, p.rows, self.shape[1], t0, tiles)
                outs.append(torch.nn.functional.linear(flat, w))
        out = torch.cat(outs, dim=-1)
        if bias is not None:
            out = out + bias
        return out.view(*x.shape[:-1], self.shape[0])

    def dense(self) -> Tensor:
        """The [out, in] weight in `dtype` (dequantized exactly in fp32, then rounded once).

        In bf16 the C++ dequantizer gives the same bits much faster (a drafter
        quantizing the 1.5B target reads every weight this way).
        """
        if self.dtype == torch.bfloat16 and self._dequantizer_runs():
            return torch.cat([
                self.kernel.dequantize(p.data, packing.KIND_ID[p.kind], p.rows, self.shape[1], 0, -(-p.rows // packing.TILE))
                for p in self.parts
            ])
        return torch.cat([reference.affine_dequantize(d) for d in self.decoded()]).to(self.dtype)

    def bits_per_value(self) -> float:
        """Bits read per weight value, block scales included."""
        return sum(reference.bits(p.kind) * p.rows for p in self.parts) / self.shape[0]

    def requantized(self, kind: str) -> "GgufWeight":
        """The same matrix re-quantized to block type `kind` from its exact fp32 values (Q4_0: each block's
        scale fitted, `requantize.fitted`, on the kernel where it runs; others: round to nearest,
        `reference.quantize`): a drafter that reads fewer bytes per step. Lossy, so only for weights whose
        outputs the target checks."""
        dense = torch.cat([reference.affine_dequantize(d) for d in self.decoded()])
        blocks = requantize.fitted(dense, self.kernel) if kind == "Q4_0" else reference.quantize(kind, dense)
        return GgufWeight([(kind, blocks)], dtype=self.dtype, kernel=self.kernel or False)

    def take_rows(self, ids: Tensor) -> "GgufWeight":
        """Output rows `ids` (ascending) as a new weight, repacked (a drafter's frequency-ranked head)."""
        picked = _slice_decoded(self.decoded(), ids)
        return self._from_parts([self._part_from_decoded(d) for d in picked], self)

    def __getitem__(self, rows: slice) -> "GgufWeight":
        """Some output rows (a drafter's truncated head). A prefix shares storage; other slices are repacked."""
        start, stop, step = rows.indices(self.shape[0])
        if start != 0 or step != 1:
            picked = _slice_decoded(self.decoded(), rows)
            return self._from_parts([self._part_from_decoded(d) for d in picked], self)
        kept, left = [], stop
        for p in self.parts:
            if left <= 0:
                break
            take = min(p.rows, left)
            kept.append(self._prefix(p, take))
            left -= take
        return self._from_parts(kept, self)

    def _prefix(self, p: Part, take: int) -> Part:
        if take == p.rows:
            return p
        if not p.packed:
            return Part(p.kind, take, p.data[:take], packed=False)
        lay = packing.LAYOUTS[p.kind]
        tile_bytes = self.shape[1] // lay.group_k * lay.group_bytes
        return Part(p.kind, take, p.data[: -(-take // packing.TILE) * tile_bytes], packed=True)

    def _part_from_decoded(self, dec: reference.Decoded) -> Part:
        if self.kernel is None:
            raise NotImplementedError("the torch fallback keeps raw blocks; slice its rows from the start")
        return Part(dec.kind, dec.q.shape[0], packing.pack(dec), packed=True)


def _isa_of(kernel: ModuleType | None) -> str:
    """The variant a weight's matmuls run: the machine's choice (`kernel_isa`) for the built extension."""
    if kernel is None:
        return "torch"
    return kernel_isa() if kernel is extension() else kernel.available_isas()[0]


def _slice_decoded(parts: list[reference.Decoded], rows: slice | Tensor) -> list[reference.Decoded]:
    """The given output rows (a slice, or ascending ids) of stacked decoded parts, part by part."""
    total = sum(d.q.shape[0] for d in parts)
    wanted = torch.arange(total)[rows]
    out, base = [], 0
    for dec in parts:
        n = dec.q.shape[0]
        local = wanted[(wanted >= base) & (wanted < base + n)] - base
        base += n
        if local.numel() == 0:
            continue
        blocks = dec.fields["d"].shape[0] // n
        fields = {
            name: f.reshape(n, blocks, -1)[local].reshape(local.numel() * blocks, -1) for name, f in dec.fields.items()
        }
        out.append(reference.assemble(dec.kind, dec.q[local], fields))
    return out


def fallback_matmul(x: Tensor, parts: list[reference.Decoded]) -> Tensor:
    """x: [R, in] -> fp32 [R, out]: the kernel's arithmetic (see reference.py) in torch ops.

    Integer dot products are exact in fp32 (|sum| < 2^24), and the sub-block
    terms are added one sub-block at a time, elementwise, so each row's result
    does not depend on the other rows.
    """
    rows = reference.quantize_rows(x)
    r = x.shape[0]
    outs = []
    for dec in parts:
        sub = reference.SUB[dec.kind]
        out, n_in = dec.q.shape
        j = n_in // sub
        xq = rows.xq.float().reshape(r, j, sub).transpose(0, 1)  # [J, R, sub]
        dx = rows.dx.repeat_interleave(reference.ACT_BLOCK // sub, dim=1)  # [R, J]
        xsum = rows.xsum
        step = max(16, (1 << 22) // max(1, r * j))
        for o0 in range(0, out, step):
            q = dec.q[o0 : o0 + step].float().reshape(-1, j, sub).permute(1, 2, 0)  # [J, sub, O]
            dots = torch.bmm(xq, q)  # [J, R, O], exact integers
            if dec.zero:
                dots = dots - dec.zero * xq.sum(-1, keepdim=True)
            scale = dec.scale[o0 : o0 + step].t()  # [J, O]
            acc = torch.zeros(r, q.shape[-1])
            for i in range(j):
                acc = acc + (dots[i] * dx[:, i : i + 1]) * scale[i]
                if dec.min is not None:
                    acc = acc + dec.min[o0 : o0 + step, i] * xsum[:, i : i + 1]
            outs.append(acc)
    return torch.cat(outs, dim=1)
