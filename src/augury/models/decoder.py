"""One readable decoder-only transformer for every family in families.py (llama, qwen2/3, phi3, gemma2/3).

The families differ only in a handful of switches (biases on q/k/v, q/k
norms, extra norms after attention and MLP, embedding scale, activation,
sliding-window layers, RoPE frequency scaling, soft-capped logits), so they
share one code path configured by `ModelConfig`, never by model names.

Every forward takes a block of T new tokens per sequence with explicit
positions and an optional block mask, appends their K/V to the cache and
returns logits for the rows asked for. Plain decoding (T = 1), prefill,
verification of a K-token chain and of a token tree all use this one path.

Batch invariance: a CPU matmul's row comes out bitwise the same whatever
the row count only for some row counts: libraries pick kernels by the number
of rows, and kernels round differently. Padding every matmul's rows to a
count that is invariant on this machine (`pad_rows`, measured at load by
`calibration.calibrate`; attention goes row by row for blocks) makes a token's logits the same bits whether it was
decoded alone or verified inside a block of drafted tokens: speculative greedy
output then equals plain greedy output exactly, not merely up to near-ties.
`exact=False` turns the padding off.
"""

from __future__ import annotations

import functools
import weakref
from dataclasses import replace

import torch
import torch.nn.functional as F
from torch import Tensor

from augury.cache import CacheGroup, KVCache, LayerCache
from augury.calibration import NO_PADDING, RowPadding, calibrate
from augury.kernels.weight import PREFILL_ROWS
from augury.models.attention import RopeTable, attend, attention_mask, rotate, row_key_sets, softcap
from augury.models.config import LayerWeights, ModelConfig, PackedWeight, Weights
from augury.models.native_layers import NativeStack
from augury.models.onednn import OneDnnWeight, onednn_packing_available

# Moved to attention.py, config.py and onednn.py, and still imported from here.
__all__ = ["LayerWeights", "ModelConfig", "OneDnnWeight", "PackedWeight", "RopeTable", "Weights", "attention_mask",
           "onednn_packing_available", "rotate", "row_key_sets"]


def dense_weight(weight: Tensor | PackedWeight) -> Tensor:
    """A linear weight as a plain [out, in] tensor, whatever format it is stored in."""
    return weight if isinstance(weight, Tensor) else weight.dense()


LINEAR_FIELDS = ("wqkv", "wo", "w_gate_up", "w_down")


def pack_weights(weights: Weights) -> Weights:
    """The same model with every matmul weight in oneDNN's packed layout (call where
    `onednn_packing_available`). Embeddings, norms and biases stay plain tensors."""
    layers = [
        replace(layer, **{name: OneDnnWeight(getattr(layer, name)) for name in LINEAR_FIELDS})
        for layer in weights.layers
    ]
    tied = weights.lm_head is weights.embed
    head = OneDnnWeight(weights.lm_head, shared_dense=weights.embed if tied else None)
    return Weights(embed=weights.embed, final_norm=weights.final_norm, lm_head=head, layers=layers)


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm computed in fp32 (as the reference models do), returned in x's dtype.

    x: [..., N], weight: [N] holding the full multiplier (gemma's 1 + w is
    folded in at load time).
    """
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (x32 * weight.float()).to(x.dtype)


def linear(x: Tensor, weight: Tensor | PackedWeight, bias: Tensor | None = None) -> Tensor:
    """x @ weight.T + bias. x: [..., in]; weight: [out, in] or a packed (e.g. quantized) weight.

    A packed weight brings its own matmul, so a low-precision drafter can share
    this decoder's code path instead of duplicating it.
    """
    if isinstance(weight, Tensor):
        return F.linear(x, weight, bias)
    return weight.linear(x, bias)


class Decoder:
    """A decoder-only transformer over preloaded weights.

    Not an nn.Module: there is nothing to train here and plain tensors keep the
    per-call overhead (which matters for a drafter on a CPU) minimal.
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: Weights,
        *,
        exact: bool = True,
        padding: RowPadding | None = None,
        native: bool = True,
    ) -> None:
        """padding: the batch-invariant row padding measured for these weights on this machine
        (the loader caches it); None measures it here when exact. native: run blocks attended
        row by row through the C++ layer where the weights allow (native_layers.py); False keeps
        every block on the torch layer, the reference."""
        self.config = config
        self.weights = weights
        self.dtype = weights.embed.dtype
        self.device = weights.embed.device
        if not exact or self.device.type != "cpu":
            # GPUs give no such guarantee for their split-K kernels, so nothing is padded there.
            padding = NO_PADDING
        elif padding is None:
            padding = measure_padding(weights, self.dtype)
        self.padding = padding
        self.rope_global = RopeTable.scaled(config, self.dtype, self.device)  # linear, llama3, longrope
        self.rope_local = (
            RopeTable(config.head_dim, config.rope_theta_local, self.dtype, self.device)
            if config.rope_theta_local is not None
            else self.rope_global
        )
        self.scale = config.query_scale if config.query_scale is not None else config.head_dim**-0.5
        # Blocks up to this many rows (decode steps, verification, token
        # trees) attend row by row, which keeps each row's result independent
        # of its block; longer blocks (prefill) use one masked attention call.
        # A drafter (not exact) needs no such independence: only its one-token steps and tiny
        # catch-ups go row by row (one call per row and layer is the fastest there, and lets a
        # drafter batch sequences whose caches are separate, see cache.CacheGroup).
        self.row_attention_limit = PREFILL_ROWS if exact else 4
        # On a GPU short blocks attend in one masked call as well: a launch per row and layer costs
        # more there than the whole call (a 128-row decode step: 3,584 launches), and its kernels keep
        # no row bitwise apart from its batch anyway (see the padding above). A cache group cannot be
        # viewed as one tensor, so its rows still attend alone.
        self.masked_short_blocks = self.device.type != "cpu"
        self.native = NativeStack.build(config, weights, self.scale) if native else None
        self.head_ids: Tensor | None = None  # [N] the token ids lm_head's rows stand for (with_head_rows), or all

    def with_head_rows(self, rows: int | Tensor) -> "Decoder":
        """The same decoder (shared weights and settings) projecting onto some token ids only: the first
        `rows` ids (logits [.., rows]), or a tensor of ascending ids [N] (a drafter's frequency-ranked
        head: its logits keep the whole vocabulary, -inf outside the subset, so token ids, penalties
        and q_draft's support mean what they mean for the full head)."""
        w = self.weights
        ids = None if isinstance(rows, int) else rows.long()
        if ids is None:
            lm_head = w.lm_head[:rows]
        elif hasattr(w.lm_head, "take_rows"):  # GGUF blocks: the rows repacked, still on the kernel
            lm_head = w.lm_head.take_rows(ids)
        else:  # a tensor, or another packed format as its dense rows
            lm_head = dense_weight(w.lm_head).index_select(0, ids)
        head = Weights(embed=w.embed, final_norm=w.final_norm, lm_head=lm_head, layers=w.layers)
        clone = Decoder.__new__(Decoder)
        clone.__dict__.update(self.__dict__)
        clone.weights = head
        clone.head_ids = ids
        return clone

    def pad_rows(self, rows: int) -> int:
        """How many rows a matmul over `rows` real rows is padded to (see module doc)."""
        return self.padding.pad(rows)

    def new_cache(self, batch_size: int, max_len: int | None = None) -> KVCache:
        """An empty KV cache for this model; max_len defaults to the context length."""
        c = self.config
        return KVCache(
            c.num_layers,
            batch_size,
            c.num_kv_heads,
            c.head_dim,
            (max_len or c.context_length) + max(8, self.pad_rows(1)),  # room for padding rows (see pad_rows)
            dtype=self.dtype,
            device=self.device,
        )

    def forward(self, tokens: Tensor, cache: KVCache | CacheGroup, *, positions: Tensor | None = None,
                block_mask: Tensor | None = None, logits_rows: Tensor | slice | None = None) -> Tensor:
        """Run a block of new tokens, append their K/V to the cache; logits [B, R, V] in fp32 (see forward_states)."""
        return self.forward_states(tokens, cache, positions=positions, block_mask=block_mask, logits_rows=logits_rows,
                                   states=None)[0]

    @torch.inference_mode()
    def forward_states(
        self,
        tokens: Tensor,
        cache: KVCache | CacheGroup,
        *,
        positions: Tensor | None = None,
        block_mask: Tensor | None = None,
        logits_rows: Tensor | slice | None = None,
        states: tuple[int, ...] | None = (),
    ) -> tuple[Tensor, Tensor | None]:
        """Run a block of new tokens and append their K/V to the cache.

        tokens: [B, T] token ids.
        positions: [B, T] rope positions; default cache.lengths[b] + arange(T).
        block_mask: [B, T, T] or [T, T] bool, which block tokens each block token sees (default causal).
        logits_rows: which of the T rows to project to logits (index tensor or slice); default all.
        states: None for no hidden states, else the layers whose outputs come along. Returns logits
        [B, R, V] in fp32 and the hidden states [B, T, hidden * (len(states) + 1)] (None when states
        is None): the outputs of the given layers (the residual stream after each, in the order given),
        then the final normed state, concatenated on the last axis (EAGLE-3 style drafters read
        several depths; MTP/EAGLE-1 heads read the last). The cached prefix is always visible; every
        sequence's cache length grows by T, and callers truncate what they do not keep.
        """
        batch, t = tokens.shape
        if positions is None:
            base = torch.tensor(cache.lengths, device=self.device).unsqueeze(1)
            positions = base + torch.arange(t, device=self.device)
        cache.check_room(t)
        # Only blocks that attend row by row can give a row its bits alone; a longer block (a prompt)
        # attends in one masked call anyway, so its matmuls run unpadded (splitting a prompt into
        # pieces would read the weights once per piece).
        padding = self.padding if t <= self.row_attention_limit else NO_PADDING
        layers = states or ()
        hidden = self._run_layers(tokens, positions, cache, block_mask, layers, padding)
        final = hidden[..., -self.config.hidden_size :] if layers else hidden
        logits = self.project(final if logits_rows is None else final[:, logits_rows], padding)
        return logits, (hidden if states is not None else None)

    @property
    def ragged(self) -> bool:
        """Whether `forward_rows` runs here: blocks of different lengths in one forward, none padded."""
        return self.native is not None

    @torch.inference_mode()
    def forward_rows(
        self, blocks: list[list[int]], cache: KVCache, logits_from: list[int], *, states: tuple[int, ...] | None = None
    ) -> tuple[list[Tensor], list[Tensor] | None]:
        """One forward over sequences that bring blocks of different lengths (the native layer's rows).

        blocks[b]: the token ids sequence b appends after its cached slots (a
        decode block, a piece of a prompt, or none this time); no block is padded to another's
        length, and every row's bits are the ones it gets alone (the native
        layer's rows never mix). logits_from[b]: the first row of block b to
        project to logits (len(blocks[b]) for none: a prompt piece before its
        last). Returns per sequence fp32 logits [len - logits_from, V] and, when
        states is not None, its hidden states [len, hidden * (len(states) + 1)]
        (as forward_states). Each sequence's cache length grows by its block's.
        """
        if self.native is None:
            raise ValueError("forward_rows needs the native layer (GGUF blocks on the built kernel)")
        counts = [len(b) for b in blocks]
        if len(blocks) != cache.batch_size or sum(counts) < 1:
            raise ValueError(f"{len(blocks)} blocks of {counts} rows for a cache of {cache.batch_size} sequences")
        lengths = cache.lengths
        if max(n + c for n, c in zip(lengths, counts)) > cache.max_len:
            raise ValueError(f"KV cache full: need {max(n + c for n, c in zip(lengths, counts))} slots, "
                             f"have {cache.max_len}")
        c = self.config
        w = self.weights
        tokens = torch.tensor([t for block in blocks for t in block], device=self.device)
        count_t = torch.tensor(counts)
        row_seq = torch.arange(len(blocks)).repeat_interleave(count_t)
        starts = torch.tensor(lengths).repeat_interleave(count_t)
        first = torch.cumsum(count_t, 0) - count_t  # each block's first flat row
        row_slot = starts + torch.arange(len(tokens)) - first.repeat_interleave(count_t)
        x = F.embedding(tokens, w.embed)
        if c.embed_scale != 1.0:
            x = x * torch.tensor(c.embed_scale, dtype=x.dtype)
        layers = states or ()
        x, taken = self.native.run_rows(x, row_seq, row_slot, cache, layers)
        cache.lengths = [n + k for n, k in zip(lengths, counts)]
        final = rms_norm(x, w.final_norm, c.rms_eps).to(self.dtype)
        wanted = [torch.arange(f + s, f + n) for f, s, n in zip(first.tolist(), logits_from, counts)]
        picked = torch.cat(wanted)
        logits = self.project(final[picked].unsqueeze(0))[0] if len(picked) else None
        sizes = [len(i) for i in wanted]
        per_seq = list(logits.split(sizes)) if logits is not None else [final.new_zeros(0, c.vocab_size)] * len(blocks)
        if states is None:
            return per_seq, None
        hidden = torch.cat([taken[i].to(self.dtype) for i in layers] + [final], dim=-1) if layers else final
        return per_seq, list(hidden.split(counts))

    def _linear(
        self, x: Tensor, weight: Tensor | PackedWeight, bias: Tensor | None = None, padding: RowPadding | None = None
    ) -> Tensor:
        """x: [..., in] -> [..., out], its rows run as batch-invariant matmuls (see module doc).

        padding: default the decoder's. The rows go in pieces (one unless
        there are more than the calibration covers), each padded with copies
        of its last row: a matmul's rows do not see each other, so padding
        changes nothing but which kernel runs.
        """
        rows = x.numel() // x.shape[-1]
        pieces = (self.padding if padding is None else padding).pieces(rows)
        if len(pieces) == 1 and pieces[0][1] == rows:  # nothing to pad (drafters, prompts): no extra ops
            return linear(x, weight, bias)
        flat = x.reshape(rows, x.shape[-1])
        outs, start = [], 0
        for real, padded in pieces:
            piece = flat[start : start + real]
            if padded > real:
                piece = torch.cat([piece, piece[-1:].expand(padded - real, -1)])
            out = linear(piece, weight, bias)
            outs.append(out[:real] if padded > real else out)
            start += real
        out = outs[0] if len(outs) == 1 else torch.cat(outs)
        return out.view(*x.shape[:-1], out.shape[-1])

    def project(self, rows: Tensor, padding: RowPadding | None = None) -> Tensor:
        """Final normed rows [B, R, hidden] -> fp32 logits [B, R, V] (soft-capped where the model says so)."""
        if rows.shape[-2] == 0:  # no rows asked for (a collector that takes the states alone)
            return rows.new_zeros(*rows.shape[:-1], self.config.vocab_size, dtype=torch.float32)
        logits = softcap(self._linear(rows, self.weights.lm_head, padding=padding).float(), self.config.final_softcap)
        if self.head_ids is None:
            return logits
        full = logits.new_full((*logits.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.head_ids, logits)

    def _run_layers(
        self,
        tokens: Tensor,
        positions: Tensor,
        cache: KVCache,
        block_mask: Tensor | None,
        hidden_layers: tuple[int, ...] = (),
        padding: RowPadding | None = None,
    ) -> Tensor:
        """The final normed states [B, T, hidden], after the outputs of `hidden_layers` if any are asked for."""
        c = self.config
        w = self.weights
        batch, t = tokens.shape
        x = F.embedding(tokens, w.embed)
        if c.embed_scale != 1.0:
            x = x * torch.tensor(c.embed_scale, dtype=x.dtype)
        if self.native is not None and t <= self.row_attention_limit:
            x, native_taken = self.native.run(x, positions, cache, block_mask, hidden_layers)
            cache.advance(t)
            final = rms_norm(x, w.final_norm, c.rms_eps).to(self.dtype)
            if not hidden_layers:
                return final
            return torch.cat([native_taken[i].to(self.dtype) for i in hidden_layers] + [final], dim=-1)
        total = max(cache.lengths) + t

        def visibility(window: int | None):
            if t <= self.row_attention_limit and not (self.masked_short_blocks and isinstance(cache, KVCache)):
                # Each real row attends alone to exactly the keys it sees: the same
                # call shape whether the token is decoded alone or verified in a block.
                return row_key_sets(cache.lengths, positions, block_mask, window=window)
            return attention_mask(cache.lengths, positions, total, block_mask, window=window)

        attend_global = visibility(None)
        attend_local = visibility(c.sliding_window) if c.sliding_window else attend_global
        rope_global = self.rope_global.lookup(positions)
        rope_local = self.rope_local.lookup(positions) if self.rope_local is not self.rope_global else rope_global
        taken: dict[int, Tensor] = {}
        for i, layer in enumerate(w.layers):
            sliding = c.is_sliding(i)
            x = self.layer(i, layer, x, cache, rope_local if sliding else rope_global,
                           attend_local if sliding else attend_global, total, padding)
            if i in hidden_layers:
                taken[i] = x
        cache.advance(t)
        final = rms_norm(x, w.final_norm, c.rms_eps)
        if not hidden_layers:
            return final
        return torch.cat([taken[i] for i in hidden_layers] + [final], dim=-1)

    def layer(self, i: int, layer: LayerWeights, x: Tensor, cache: LayerCache, rope: tuple[Tensor, Tensor],
              attend, total: int, padding: RowPadding | None = None) -> Tensor:
        """Decoder layer i over the residual stream x [B, T, hidden] -> [B, T, hidden], writing its K/V.

        Public because a drafter head runs this architecture's layer body through it (models/head.py).
        """
        c = self.config
        h = self._attention(i, layer, rms_norm(x, layer.attn_norm, c.rms_eps), cache, rope, attend, total, padding)
        if layer.post_attn_norm is not None:
            h = rms_norm(h, layer.post_attn_norm, c.rms_eps)
        x = x + h
        h = self._mlp(layer, rms_norm(x, layer.mlp_norm, c.rms_eps), padding)
        if layer.post_mlp_norm is not None:
            h = rms_norm(h, layer.post_mlp_norm, c.rms_eps)
        return x + h

    def _attention(
        self,
        index: int,
        layer: LayerWeights,
        h: Tensor,
        cache: KVCache,
        rope: tuple[Tensor, Tensor],
        mask: Tensor | list,
        total: int,
        padding: RowPadding | None = None,
    ) -> Tensor:
        """h: [B, T, hidden] -> [B, T, hidden]; writes this block's K/V for layer `index`.

        mask: a [B, 1, T, S] mask (batched path) or per-row key sets from
        `row_key_sets` (row path).
        """
        c = self.config
        batch, t, _ = h.shape
        qkv = self._linear(h, layer.wqkv, layer.bqkv, padding)
        q_size, kv_size = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        q = qkv[..., :q_size].view(batch, t, c.num_heads, c.head_dim).transpose(1, 2)
        k = qkv[..., q_size : q_size + kv_size].view(batch, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        v = qkv[..., q_size + kv_size :].view(batch, t, c.num_kv_heads, c.head_dim).transpose(1, 2)
        if layer.q_norm is not None:
            q = rms_norm(q, layer.q_norm, c.rms_eps)
            k = rms_norm(k, layer.k_norm, c.rms_eps)
        cos, sin = rope
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        cache.write(index, k, v)
        if isinstance(mask, Tensor):
            keys, values = cache.view(index, total)
            out = attend(q, keys, values, mask, self.scale, c.attn_softcap)
            out = out.transpose(1, 2).reshape(batch, t, q_size)
        else:
            out = self._attend_rows(index, q, cache, mask).view(batch, t, q_size)
        return self._linear(out, layer.wo, padding=padding)

    def _attend_rows(self, index: int, q: Tensor, cache: KVCache, key_sets: list) -> Tensor:
        """Attention one query row at a time. q: [B, H, T, D] -> [B * T, H_kv, H / H_kv, D], rows in (b, i) order.

        The query heads that share a KV head are folded into the row axis
        ([1, H_kv, H/H_kv, D]), which is exact and much faster than GQA
        broadcasting for a single row. The rows are concatenated once at the
        end rather than written one by one into an output tensor (one small op
        per row and layer fewer, and no transposed copy after).
        """
        c = self.config
        group = c.num_heads // c.num_kv_heads
        rows = []
        kv = [cache.row_kv(index, b) for b in range(q.shape[0])]
        for b, i, keys_at in key_sets:
            keys_b, values_b = kv[b]
            row = q[b : b + 1, :, i].reshape(1, c.num_kv_heads, group, c.head_dim)
            rows.append(attend(row, keys_b[:, :, keys_at], values_b[:, :, keys_at], None, self.scale, c.attn_softcap))
        return torch.cat(rows)

    def _mlp(self, layer: LayerWeights, h: Tensor, padding: RowPadding | None = None) -> Tensor:
        gate, up = self._linear(h, layer.w_gate_up, padding=padding).chunk(2, dim=-1)
        if self.config.activation == "gelu_tanh":
            act = F.gelu(gate, approximate="tanh")
        else:
            act = F.silu(gate)
        return self._linear(act * up, layer.w_down, padding=padding)


def weight_kinds(weights: Weights) -> list[str]:
    """The formats of a model's matmul weights (what its batch invariance depends on)."""
    layer = weights.layers[0]
    return [type(getattr(layer, name)).__name__ for name in LINEAR_FIELDS] + [type(weights.lm_head).__name__]


def measure_padding(weights: Weights, dtype: torch.dtype) -> RowPadding:
    """Calibrate the row padding on one layer's matmul weights and a slice of the output head.

    Every layer has the same shapes, so one layer shows each kernel choice; the
    head is sliced to keep the measurement short (its row count, not its
    width, is what picks the kernel). Models of the same formats and shapes
    share one measurement per process (tests build many tiny models).
    """
    layer = weights.layers[0]
    shapes = tuple(tuple(getattr(layer, name).shape) for name in LINEAR_FIELDS) + (tuple(weights.lm_head.shape),)
    return _measure_padding_once(_SameShapes(weights, (str(dtype), *weight_kinds(weights), *shapes)), dtype)


class _SameShapes:
    """Weights compared by what their padding depends on (formats and shapes), for memoizing.

    The weights are held weakly: the memo keeps its first key for the whole
    process, and a strong reference there kept every measured model (GBs for
    the real ones) alive after its last user let go of it.
    """

    def __init__(self, weights: Weights, key: tuple) -> None:
        self._weights, self.key = weakref.ref(weights), key

    @property
    def weights(self) -> Weights:
        weights = self._weights()
        assert weights is not None, "padding is measured while the caller holds the weights"
        return weights

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _SameShapes) and self.key == other.key


@functools.lru_cache(maxsize=32)
def _measure_padding_once(same: _SameShapes, dtype: torch.dtype) -> RowPadding:
    weights = same.weights
    layer = weights.layers[0]
    mats = [getattr(layer, name) for name in LINEAR_FIELDS]
    head = weights.lm_head
    mats.append(head[: min(4096, head.shape[0])])
    linears = [lambda x, w=w: linear(x, w) for w in mats]
    return calibrate(linears, [w.shape[1] for w in mats], dtype)
