"""Drafter heads on the target's own hidden states: MTP / EAGLE chains and a parallel block drafter.

A head is one decoder layer of the target's architecture between the
target's own pieces, so it needs no prefill of its own and costs a small
fraction of a target step:

    x_t  = fc([RMSNorm(s_t); RMSNorm(embed(x_{t+1}))])      # 2H -> H
    y_t  = layer(x_t)                                       # attends to the head's rows so far (own KV cache)
    logits over the N most frequent tokens = lm_head[vocab] @ final_norm(y_t)     # predicts x_{t+2}

s_t is the target's state at position t (`feature`: its final normed state,
as EAGLE-1 reads it, or the residual stream after its last layer, as
DeepSeek-V3's MTP module reads it). Head row t therefore pairs the target
state that predicted x_{t+1} with x_{t+1} itself and guesses one token
further. Two shapes of drafting share that layer:

- chain (kinds "mtp", "eagle"): the head's own output state stands in for the
  target state at the next row, so K tokens take one catch-up forward (the
  rows the target committed since the last draft) and K - 1 one-row forwards.
- parallel (DFlash / PARD-like): after the catch-up rows, K - 1 learned mask
  embeddings take the token half of the input next to the anchor state (the
  target's last state); they see each other (non-causal block) and the
  context, and all K tokens come out of one forward.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from augury.cache import KVCache, LayerCache
from augury.errors import AuguryError
from augury.models.attention import attention_mask, row_key_sets
from augury.models.decoder import Decoder, LayerWeights, ModelConfig, Weights, dense_weight, linear, rms_norm
from augury.models.loader import Model

KINDS = ("mtp", "eagle", "parallel")
FEATURES = ("final", "last_layer")
# Head blocks up to this many rows attend row by row, which also lets several
# sequences' separate caches run as one batch (cache.CacheGroup); longer
# blocks (a prompt's catch-up) run alone through one masked attention call.
ROW_LIMIT = 16
# The layer's own weights by file name (the rest of the head is fc, norms, mask, vocab).
LAYER_PREFIX = "layer."


@dataclass(frozen=True)
class HeadConfig:
    """What kind of head this is and how it was trained (everything but the target's shape).

    The variants differ where the literature does: which target state the head
    reads (EAGLE-1: the final normed state; DeepSeek-V3 MTP: the residual
    stream before the final norm), whether the loss also regresses the next
    state (EAGLE-1) or only matches the target's tokens (MTP), and how many
    chained positions the training unrolls (1 = teacher-forced only, as
    EAGLE-1; more lets the head see its own states, as later EAGLE versions
    and DeepSeek's sequential depths do). One shared layer serves every depth.
    """

    kind: str
    feature: str = "final"  # the target state read: "final" or "last_layer"
    feature_loss: float = 0.0  # weight of the smooth-L1 loss on the next state (0 = tokens only)
    train_depth: int = 1  # chained positions unrolled in training (chain kinds)
    block: int = 8  # parallel: the longest block one forward drafts (block - 1 mask embeddings)
    intermediate_size: int | None = None  # the layer's MLP width (None: the target's)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise AuguryError(f"unknown head kind '{self.kind}' (known: {', '.join(KINDS)})")
        if self.feature not in FEATURES:
            raise AuguryError(f"unknown head feature '{self.feature}' (known: {', '.join(FEATURES)})")
        if not 1 <= self.train_depth <= 8:
            raise AuguryError(f"train_depth must be in 1..8, got {self.train_depth}")
        if not 2 <= self.block <= 32:
            raise AuguryError(f"a parallel head's block must be in 2..32, got {self.block}")

    @classmethod
    def for_kind(cls, kind: str, **overrides) -> "HeadConfig":
        """Each kind's defaults: MTP reads the residual stream with a token loss only, EAGLE the final
        state with a state loss too; both unroll two chained positions; parallel reads the final state."""
        defaults = {
            "mtp": dict(feature="last_layer", feature_loss=0.0, train_depth=2),
            "eagle": dict(feature="final", feature_loss=1.0, train_depth=2),
            "parallel": dict(feature="final", feature_loss=0.0, train_depth=1, block=8),
        }
        if kind not in defaults:
            raise AuguryError(f"unknown head kind '{kind}' (known: {', '.join(KINDS)})")
        return cls(kind=kind, **{**defaults[kind], **overrides})

    @property
    def chained(self) -> bool:
        return self.kind != "parallel"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "HeadConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def feature_layers(config: HeadConfig, target: ModelConfig) -> tuple[int, ...]:
    """The decoder layers the head asks the target for (besides the final normed state, always given)."""
    return (target.num_layers - 1,) if config.feature == "last_layer" else ()


def pick_feature(config: HeadConfig, hidden: Tensor, width: int) -> Tensor:
    """The head's input state from the target's hidden output [..., H * (layers + 1)] -> [..., H] (H = width).

    With the last layer asked for, its output comes first and the final normed
    state last (see `Decoder.forward`).
    """
    return hidden[..., :width] if config.feature == "last_layer" else hidden[..., -width:]


@dataclass
class HeadWeights:
    """A head's tensors: its own (fc, norms, layer, mask) and the target's it borrows (embed, final norm, lm_head rows).

    Plain tensors for drafting, or the parameters of `train.trainer.TrainableHead`
    for training: both run through the same `Head` code.
    """

    fc: Tensor  # [H, 2H] (or a packed weight)
    state_norm: Tensor  # [H]
    token_norm: Tensor  # [H]
    layer: LayerWeights
    embed: Tensor  # [V, H], the target's
    final_norm: Tensor  # [H], the target's
    lm_head: Tensor  # [N, H]: the target's output rows at `vocab` (or a packed weight)
    vocab: Tensor  # [N] long, target token ids, ascending
    mask: Tensor | None = None  # [block - 1, H] parallel heads' learned mask embeddings
    dtype: torch.dtype = torch.float32  # what the head computes in (norm weights stay fp32)


class Head:
    """The head's forward pieces over `HeadWeights`, shared by drafting and training."""

    def __init__(self, config: HeadConfig, target: ModelConfig, weights: HeadWeights) -> None:
        self.config = config
        self.target_config = target
        self.weights = weights
        layer_config = replace(
            target, num_layers=1, sliding_window=None, sliding_pattern=0,
            intermediate_size=config.intermediate_size or target.intermediate_size,
        )
        self.dtype = weights.dtype
        self.device = weights.vocab.device
        # (the shell's embedding only tells the decoder its dtype and device)
        shell = Weights(embed=torch.empty(0, target.hidden_size, dtype=self.dtype, device=self.device),
                        final_norm=weights.final_norm, lm_head=weights.lm_head, layers=[weights.layer])
        # The head's layer runs on the decoder's own attention and MLP code (one
        # implementation of the architecture); its blocks choose their attention
        # path and visibility here, since a head's block is not a token block.
        self.runner = Decoder(layer_config, shell, exact=False)

    @property
    def vocab_size(self) -> int:
        return self.target_config.vocab_size

    def new_cache(self, batch: int, max_len: int) -> KVCache:
        c = self.runner.config
        return KVCache(1, batch, c.num_kv_heads, c.head_dim, max_len, dtype=self.dtype, device=self.device)

    def embed(self, tokens: Tensor) -> Tensor:
        """tokens: [B, T] -> the target's input embeddings [B, T, H] in the head's dtype."""
        x = F.embedding(tokens, self.weights.embed).to(self.dtype)
        scale = self.target_config.embed_scale
        return x * torch.tensor(scale, dtype=x.dtype) if scale != 1.0 else x

    def inputs(self, states: Tensor, tokens_embedded: Tensor) -> Tensor:
        """[RMSNorm(state); RMSNorm(embedding)] -> fc. states, tokens_embedded: [B, T, H] -> [B, T, H]."""
        w = self.weights
        eps = self.target_config.rms_eps
        both = torch.cat([rms_norm(states.to(self.dtype), w.state_norm, eps),
                          rms_norm(tokens_embedded.to(self.dtype), w.token_norm, eps)], -1)
        return linear(both, w.fc)

    def layer(
        self,
        x: Tensor,
        cache: LayerCache,
        *,
        positions: Tensor | None = None,
        block_mask: Tensor | None = None,
        visible: Tensor | None = None,
    ) -> Tensor:
        """The head's decoder layer over a block. x: [B, T, H] -> residual stream [B, T, H]; appends K/V.

        positions: [B, T] rope positions (default: each cache's length onward).
        block_mask: [B, T, T] visibility inside the block (default causal); the cache is visible.
        visible: [B, T, cached + T] bool, the whole visibility (training's unrolled depths need
            cached rows hidden too); forces the masked path.
        """
        w = self.weights.layer
        batch, t, _ = x.shape
        lengths = cache.lengths
        if positions is None:
            positions = torch.tensor(lengths, device=x.device).unsqueeze(1) + torch.arange(t, device=x.device)
        total = max(lengths) + t
        if visible is not None:
            attend = visible.unsqueeze(1)
        elif t <= ROW_LIMIT:
            attend = row_key_sets(lengths, positions, block_mask, window=None)
        else:
            attend = attention_mask(lengths, positions, total, block_mask, window=None)
        rope = self.runner.rope_global.lookup(positions)
        y = self.runner.layer(0, w, x, cache, rope, attend, total)
        cache.advance(t)
        return y

    def state(self, y: Tensor) -> Tensor:
        """The head's output [.., H] as the state the next chained row reads (in the target state's space)."""
        if self.config.feature == "final":
            return rms_norm(y, self.weights.final_norm, self.target_config.rms_eps)
        return y

    def logits(self, y: Tensor) -> Tensor:
        """Subset logits [.., N] (fp32) from the head's output [.., H], through the target's final norm."""
        normed = rms_norm(y, self.weights.final_norm, self.target_config.rms_eps)
        return linear(normed, self.weights.lm_head).float()


# -- a head's own weights ---------------------------------------------------------------------


def target_parts(target: Model) -> tuple[Tensor, Tensor, Tensor]:
    """The target's embedding [V, H], final norm [H] and dense output head [V, H] (shared, not copied, where plain)."""
    w = target.decoder.weights
    return w.embed, w.final_norm, dense_weight(w.lm_head)


def init_own_weights(config: HeadConfig, target: Model, seed: int = 0) -> dict[str, Tensor]:
    """Fresh fp32 weights for a head of `config` over `target` (the untrained head).

    The layer starts as a copy of the target's last layer (a layer that already
    reads this model's residual stream), fc as a small random projection.
    """
    c = target.config
    gen = torch.Generator().manual_seed(seed)
    hidden = c.hidden_size
    own = {
        "fc": torch.randn(hidden, 2 * hidden, generator=gen) * (2 * hidden) ** -0.5,
        "state_norm": torch.ones(hidden),
        "token_norm": torch.ones(hidden),
    }
    last = target.decoder.weights.layers[-1]
    width = config.intermediate_size or c.intermediate_size
    for f in fields(LayerWeights):
        value = getattr(last, f.name)
        if value is None:
            continue
        value = dense_weight(value).float().clone()
        if f.name == "w_gate_up" and width != c.intermediate_size:
            gate, up = value.chunk(2)
            value = torch.cat([gate[:width], up[:width]])
        elif f.name == "w_down" and width != c.intermediate_size:
            value = value[:, :width].contiguous()
        own[LAYER_PREFIX + f.name] = value
    if not config.chained:
        own["mask"] = torch.randn(config.block - 1, hidden, generator=gen) * 0.3
    return own
