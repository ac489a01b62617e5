"""The decoder's layers as one C++ call each, for blocks attended row by row (decode, verification, batches).

Why: on the GGUF path a decode step's weight stream is a single kernel call per
matmul, but the rest of each layer (norms, RoPE, the cache write, one attention
call per row, activations, residuals) was ~50 small torch ops, about 40% of a
1.5B step on 2 cores. `NativeLayer` (kernels/csrc/layer_body.h) does a whole
layer in one call, in fp32 activations, with the GIL released.

The torch layer in decoder.py stays the reference and the fallback: blocks past
the row-attention limit (prompts), weights that are not all GGUF blocks on the
kernel, and `Decoder(native=False)` take it. The native layer is batch invariant
by construction (rows never mix; each row attends to its own key set in slot
order), so block rows are bitwise single-step rows without any padding; its
results differ from the torch layer's only by rounding (fp32 activations where
the torch path rounds to bf16 between ops), bounded in tests/test_native_layer.py.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from augury.kernels import packing

if TYPE_CHECKING:
    from augury.cache import CacheGroup, KVCache
    from augury.models.config import ModelConfig, Weights

_EMPTY = torch.zeros(0, dtype=torch.long)


def kernel_matrix(weight) -> tuple[list[Tensor], list[int], list[int]]:
    """(packed parts, kind ids, rows): a GGUF weight as the extension's NativeLayer takes a matrix."""
    return [p.data for p in weight.parts], [packing.KIND_ID[p.kind] for p in weight.parts], [p.rows for p in weight.parts]


def _f32(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach().float().contiguous()


class NativeStack:
    """Every layer of one decoder as a `NativeLayer`, and the row tables a block needs."""

    def __init__(self, config: "ModelConfig", weights: "Weights", kernel, isa: str, scale: float) -> None:
        """scale: the query scale the decoder uses (its `scale`)."""
        self.config = config
        c = config
        self.layers = [
            kernel.NativeLayer(
                attn_norm=_f32(layer.attn_norm), mlp_norm=_f32(layer.mlp_norm),
                qkv=kernel_matrix(layer.wqkv), wo=kernel_matrix(layer.wo), gate_up=kernel_matrix(layer.w_gate_up),
                down=kernel_matrix(layer.w_down), bqkv=_f32(layer.bqkv), q_norm=_f32(layer.q_norm),
                k_norm=_f32(layer.k_norm), post_attn_norm=_f32(layer.post_attn_norm),
                post_mlp_norm=_f32(layer.post_mlp_norm), n_heads=c.num_heads, n_kv=c.num_kv_heads,
                head_dim=c.head_dim, eps=c.rms_eps, scale=scale, gelu=c.activation == "gelu_tanh", isa=isa,
            )
            for layer in weights.layers
        ]
        self.isa = isa
        from augury.models.attention import RopeTable

        # fp32 tables: the native layer computes in fp32 (the torch path's are in the model dtype); a
        # scaled RoPE (llama3, linear, longrope's divisors and attention factor) is only other values in
        # the table, so the C++ layer, which reads cos and sin as given, needs nothing.
        self.rope_global = RopeTable.scaled(c, torch.float32, torch.device("cpu"))
        self.rope_local = (
            RopeTable(c.head_dim, c.rope_theta_local, torch.float32, torch.device("cpu"))
            if c.rope_theta_local is not None
            else self.rope_global
        )

    @classmethod
    def build(cls, config: "ModelConfig", weights: "Weights", scale: float) -> "NativeStack | None":
        """The native stack where every layer's matmul weight is GGUF blocks on the built kernel, the
        head size is one the layer takes (16..256 in steps of 16) and the attention is one it computes
        (no soft-capped scores: Gemma 2), else None (the torch layer runs, on the same blocks)."""
        from augury.kernels.weight import GgufWeight

        names = ("wqkv", "wo", "w_gate_up", "w_down")
        mats = [getattr(layer, name) for layer in weights.layers for name in names]
        if not mats or not all(isinstance(m, GgufWeight) and m.kernel is not None for m in mats):
            return None
        if config.activation not in ("silu", "gelu_tanh") or weights.embed.device.type != "cpu":
            return None
        if config.head_dim % 16 or not 16 <= config.head_dim <= 256:
            return None
        if config.attn_softcap is not None:  # layer_body.h's softmax has no soft-cap step
            return None
        if not all(p.packed for m in mats for p in m.parts):
            return None
        kernel = mats[0].kernel
        if not hasattr(kernel, "NativeLayer"):
            return None
        return cls(config, weights, kernel, mats[0].isa, scale)

    def run(
        self,
        x: Tensor,
        positions: Tensor,
        cache: "KVCache | CacheGroup",
        block_mask: Tensor | None,
        hidden_layers: tuple[int, ...] = (),
    ) -> tuple[Tensor, dict[int, Tensor]]:
        """x: [B, T, hidden] embedded block -> (residual stream [B, T, hidden] fp32, {layer: its output}).

        Writes every layer's K/V for the block; the caller advances the cache.
        """
        batch, t = positions.shape
        lengths = cache.lengths
        row_seq = torch.arange(batch).repeat_interleave(t)
        row_slot = (torch.tensor(lengths).unsqueeze(1) + torch.arange(t)).reshape(-1)
        tables_global = self._key_tables(lengths, positions, block_mask, None)
        tables_local = (
            self._key_tables(lengths, positions, block_mask, self.config.sliding_window)
            if self.config.sliding_window else tables_global
        )
        flat, taken = self._layers(x.reshape(batch * t, -1), row_seq, row_slot, positions.reshape(-1), cache,
                                   tables_global, tables_local, hidden_layers)
        return flat.view(batch, t, -1), {i: out.view(batch, t, -1) for i, out in taken.items()}

    def run_rows(
        self, x: Tensor, row_seq: Tensor, row_slot: Tensor, cache: "KVCache | CacheGroup",
        hidden_layers: tuple[int, ...] = (),
    ) -> tuple[Tensor, dict[int, Tensor]]:
        """A ragged block: x [N, hidden] embedded rows, row r of sequence row_seq[r] at cache slot
        row_slot[r] (its position), attending causally to its sequence's slots up to its own.

        Sequences may bring any number of rows (a decode row beside a prompt piece), and no row is
        padded; each row's bits are the ones it gets in any other block. Returns (residual stream
        [N, hidden] fp32, {layer: its output}); writes every layer's K/V, the caller advances the cache.
        """
        hi = row_slot + 1
        tables_global = (torch.zeros_like(hi), hi, torch.zeros(len(hi) + 1, dtype=torch.long), _EMPTY)
        tables_local = tables_global
        if self.config.sliding_window:
            lo = (row_slot + 1 - self.config.sliding_window).clamp(min=0)
            tables_local = (lo.contiguous(), hi, tables_global[2], _EMPTY)
        return self._layers(x, row_seq, row_slot, row_slot, cache, tables_global, tables_local, hidden_layers)

    def _layers(self, x: Tensor, row_seq: Tensor, row_slot: Tensor, positions: Tensor, cache, tables_global,
                tables_local, hidden_layers: tuple[int, ...]) -> tuple[Tensor, dict[int, Tensor]]:
        """Every layer over flat rows x [N, hidden]; positions [N] pick the RoPE rows."""
        c = self.config
        flat = x.float().contiguous()
        if flat.data_ptr() == x.data_ptr():
            flat = flat.clone()  # updated in place: never the caller's tensor
        rope_global = self._rope(self.rope_global, positions)
        rope_local = self._rope(self.rope_local, positions) if self.rope_local is not self.rope_global else rope_global
        row_seq, row_slot = row_seq.contiguous(), row_slot.contiguous()
        taken: dict[int, Tensor] = {}
        for i, layer in enumerate(self.layers):
            sliding = c.is_sliding(i)
            keys, values = cache.sequence_kv(i)
            cos, sin = rope_local if sliding else rope_global
            tables = tables_local if sliding else tables_global
            layer.forward(flat, keys, values, row_seq, row_slot, *tables, cos, sin)
            if i in hidden_layers:
                taken[i] = flat.clone()
        return flat, taken

    @staticmethod
    def _rope(table, positions: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = table.lookup(positions)  # [B, 1, T, D]
        return cos.reshape(-1, cos.shape[-1]).contiguous(), sin.reshape(-1, sin.shape[-1]).contiguous()

    @staticmethod
    def _key_tables(
        lengths: list[int], positions: Tensor, block_mask: Tensor | None, window: int | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(key_lo, key_hi, extra_off, extra_slots): row r attends to slots [lo, hi), then its extra slots.

        A chain row sees a contiguous range (its prefix and the block up to
        itself, cut by the sliding window); a tree row's slots come whole from
        `row_key_sets` as extra slots.
        """
        batch, t = positions.shape
        start = torch.tensor(lengths).unsqueeze(1)
        if block_mask is None:
            hi = start + torch.arange(t) + 1  # [B, T]
            lo = torch.zeros_like(hi) if window is None else (positions + 1 - window).clamp(min=0).minimum(hi - 1)
            off = torch.zeros(batch * t + 1, dtype=torch.long)
            return lo.reshape(-1).contiguous(), hi.reshape(-1).contiguous(), off, _EMPTY
        from augury.models.attention import row_key_sets

        slots = [torch.as_tensor(keys_at).reshape(-1) if isinstance(keys_at, Tensor) else torch.arange(
            keys_at.start, keys_at.stop) for _, _, keys_at in row_key_sets(lengths, positions, block_mask, window=window)]
        counts = torch.tensor([len(s) for s in slots])
        off = F.pad(counts.cumsum(0), (1, 0))
        zeros = torch.zeros(batch * t, dtype=torch.long)
        return zeros, zeros.clone(), off.contiguous(), torch.cat(slots).long().contiguous()
