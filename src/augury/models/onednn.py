"""oneDNN's prepacked bf16 matmul weights (split from decoder.py, which packs a model's weights with them)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


class OneDnnWeight:
    """A bf16 [out, in] weight reordered once into oneDNN's blocked layout for fast small-row matmuls.

    Why: torch's plain `F.linear` on bf16 reaches only 20-29 GB/s of weight
    reads for the 1-32 row matmuls of decoding and verification on the 2-core
    development CPU (AVX-512 BF16, no AMX), while oneDNN's prepacked brgemm
    kernel reads the same bytes at 45-70 GB/s: a decode step of the 1.5B target
    went from 143 ms to 82 ms. The packed kernel is also batch invariant over every row count >= 2
    (measured up to 600 rows; `F.linear` only up to 32) and gives bitwise the
    rows `F.linear` gives for two rows, so plain decoding, verification blocks
    and server batches of any size agree bitwise.

    The dense weight is not kept (it would double memory); `dense()` rebuilds it
    exactly (multiplying the identity by bf16 weights and accumulating in fp32 is
    exact) for the rare users: quantizing a drafter, building a transformers
    peer, slicing an output head. `shared_dense` keeps a tensor that is stored
    anyway (tied embeddings) so those need no rebuild.
    """

    def __init__(self, weight: Tensor, *, shared_dense: Tensor | None = None) -> None:
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), 1)
        self.shape = weight.shape  # [out, in]
        self.dtype = weight.dtype
        self.shared_dense = shared_dense

    def linear(self, x: Tensor, bias: Tensor | None) -> Tensor:
        """x: [..., in] -> [..., out]."""
        flat = x.reshape(-1, self.shape[1]).contiguous()
        out = torch.ops.mkldnn._linear_pointwise(flat, self.packed, bias, "none", [], "")
        return out.view(*x.shape[:-1], self.shape[0])

    def dense(self) -> Tensor:
        """The [out, in] weight, bitwise."""
        if self.shared_dense is not None:
            return self.shared_dense
        eye = torch.eye(self.shape[1], dtype=self.dtype)
        return self.linear(eye, None).t().contiguous()

    def __getitem__(self, rows: slice) -> "OneDnnWeight":
        """The given rows of the weight (a drafter's truncated output head), packed anew."""
        part = self.dense()[rows]
        return OneDnnWeight(part, shared_dense=part if self.shared_dense is not None else None)

    @property
    def nbytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.dtype.itemsize


def onednn_packing_available(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether oneDNN's prepacked bf16 linear runs here and matches `F.linear` bitwise (checked on a small case)."""
    if dtype != torch.bfloat16 or device.type != "cpu" or not hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        return False
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(48, 64, generator=gen).to(dtype)
    x = torch.randn(2, 64, generator=gen).to(dtype)
    try:
        out = OneDnnWeight(weight).linear(x, None)
    except (RuntimeError, NotImplementedError):
        return False
    return torch.equal(out, F.linear(x, weight))
