"""Repack GGUF blocks into the tile layout of the C++ kernel (csrc/kernel_body.h).

Why repack: a GGUF row holds one output column's blocks, so a vector of
quants belongs to one column and a dot product ends in a horizontal sum per
column. The kernel wants the opposite: each 64-byte vector holds 4 consecutive
`in` values of 16 output columns, so one VNNI instruction multiplies 16 columns
with 4 broadcast activation values and accumulates per column, with no
horizontal sums, and each unpacked weight vector serves every activation row.

Repacking only moves bits: quants keep their values (4-bit planes two vectors
per 64 bytes, the 5th/6th bits as extra planes), fp16 scales keep their bits,
Q4_K/Q5_K's 6-bit scales and mins are stored as bytes. The result is a few
percent larger than the file for Q4_K/Q5_K (decoded scale bytes) and the same
size for the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from augury.kernels.reference import Decoded, assemble

TILE = 16  # output columns per tile

# Numbering shared with csrc/gguf_matmul.cpp (enum Kind).
KIND_ID = {"Q4_0": 0, "Q4_1": 1, "Q5_0": 2, "Q5_1": 3, "Q8_0": 4, "Q4_K": 5, "Q5_K": 6, "Q6_K": 7}


@dataclass(frozen=True)
class Layout:
    """One tile's group: `group_k` in values, `subs` sub-blocks of 32 of `sub_bytes` quant bytes, then scales."""

    group_k: int
    subs: int
    sub_bytes: int
    group_bytes: int


# Must equal `layout()` in csrc/gguf_matmul.cpp (tests check it against the built extension).
LAYOUTS = {
    "Q4_0": Layout(32, 1, 256, 288),
    "Q4_1": Layout(32, 1, 256, 320),
    "Q5_0": Layout(32, 1, 320, 352),
    "Q5_1": Layout(32, 1, 320, 384),
    "Q8_0": Layout(32, 1, 512, 544),
    "Q4_K": Layout(256, 8, 256, 2368),
    "Q5_K": Layout(256, 8, 320, 2880),
    "Q6_K": Layout(256, 8, 384, 3360),
}


def _pad_rows(t: Tensor, rows: int) -> Tensor:
    if t.shape[0] == rows:
        return t
    pad = torch.zeros(rows - t.shape[0], *t.shape[1:], dtype=t.dtype)
    return torch.cat([t, pad])


def _per_tile(field: Tensor, tiles: int, groups: int) -> Tensor:
    """[out_p * groups, n] per-block field (any dtype) -> [tiles, groups, n * 16] bytes, columns innermost."""
    n = field.shape[1]
    f = field.reshape(tiles, TILE, groups, n).permute(0, 2, 3, 1).contiguous()  # [tiles, groups, n, 16]
    return f.view(torch.uint8).reshape(tiles, groups, -1)


def _planes(q: Tensor, kind: str) -> Tensor:
    """q: [tiles, nb32, 8, 64] unpacked quants in VNNI order -> [tiles, nb32, sub_bytes] packed."""
    if kind == "Q8_0":
        return q.reshape(*q.shape[:2], 512)
    lo = q & 0x0F
    parts = [(lo[:, :, :4] | (lo[:, :, 4:] << 4)).flatten(2)]
    if kind in ("Q5_0", "Q5_1", "Q5_K"):
        bit = (q >> 4) & 1
        plane = torch.zeros_like(q[:, :, 0])
        for g in range(8):
            plane |= bit[:, :, g] << g
        parts.append(plane)
    elif kind == "Q6_K":
        high = (q >> 4) & 3
        for h in range(2):
            plane = torch.zeros_like(q[:, :, 0])
            for t in range(4):
                plane |= high[:, :, 4 * h + t] << (2 * t)
            parts.append(plane)
    return torch.cat(parts, dim=-1)


def pack(dec: Decoded) -> Tensor:
    """A decoded [out, in] matrix -> the kernel's flat uint8 buffer (tiles of 16 columns, padded with zeros)."""
    kind = dec.kind
    lay = LAYOUTS[kind]
    out, n_in = dec.q.shape
    tiles = -(-out // TILE)
    out_p = tiles * TILE
    nb32 = n_in // 32
    groups = n_in // lay.group_k
    q = _pad_rows(dec.q, out_p).reshape(tiles, TILE, nb32, 8, 4).permute(0, 2, 3, 1, 4)
    quants = _planes(q.reshape(tiles, nb32, 8, 64), kind).reshape(tiles, groups, lay.subs * lay.sub_bytes)

    scales = []
    for name, n, _ in _fields_of(kind):
        f = _pad_rows(dec.fields[name].reshape(out, -1), out_p)  # [out_p, groups * n]
        scales.append(_per_tile(f.reshape(out_p * groups, n), tiles, groups))
    packed = torch.cat([quants, *scales], dim=-1)
    assert packed.shape[-1] == lay.group_bytes, (kind, packed.shape)
    return packed.reshape(-1).contiguous()


def _fields_of(kind: str) -> list[tuple[str, int, torch.dtype]]:
    """(name, values per block, dtype) of the scale fields a group stores after its quants, in order."""
    if kind in ("Q4_K", "Q5_K"):
        return [("sc", 8, torch.uint8), ("m", 8, torch.uint8), ("d", 1, torch.float16), ("dmin", 1, torch.float16)]
    if kind == "Q6_K":
        return [("sc", 16, torch.int8), ("d", 1, torch.float16)]
    return [("d", 1, torch.float16)] + ([("dmin", 1, torch.float16)] if kind.endswith("_1") else [])


def unpack(buffer: Tensor, kind: str, out: int, n_in: int) -> Decoded:
    """The exact inverse of `pack`: a packed buffer -> the decoded [out, in] matrix."""
    lay = LAYOUTS[kind]
    tiles = -(-out // TILE)
    groups = n_in // lay.group_k
    nb32 = n_in // 32
    g = buffer.reshape(tiles, groups, lay.group_bytes)
    planes = g[..., : lay.subs * lay.sub_bytes].reshape(tiles, nb32, lay.sub_bytes)
    if kind == "Q8_0":
        q = planes.reshape(tiles, nb32, 8, 64)
    else:
        nib = planes[..., :256].reshape(tiles, nb32, 4, 64)
        q = torch.cat([nib & 0x0F, nib >> 4], dim=2)
        if kind in ("Q5_0", "Q5_1", "Q5_K"):
            plane = planes[..., 256:320]
            q = q | torch.stack([((plane >> i) & 1) << 4 for i in range(8)], dim=2)
        elif kind == "Q6_K":
            high = [planes[..., 256 + 64 * h : 320 + 64 * h] for h in range(2)]
            q = q | torch.stack([((high[i // 4] >> (2 * (i % 4))) & 3) << 4 for i in range(8)], dim=2)
    q = q.reshape(tiles, nb32, 8, TILE, 4).permute(0, 3, 1, 2, 4).reshape(tiles * TILE, n_in)[:out]
    fields = {}
    pos = lay.subs * lay.sub_bytes
    for name, n, dtype in _fields_of(kind):
        size = n * TILE * dtype.itemsize
        raw = g[..., pos : pos + size].contiguous().view(dtype).reshape(tiles, groups, n, TILE)
        fields[name] = raw.permute(0, 3, 1, 2).reshape(tiles * TILE * groups, n)[: out * groups]
        pos += size
    return assemble(kind, q.contiguous(), fields)
