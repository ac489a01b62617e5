"""Drafter heads on the target's own hidden states: MTP / EAGLE chains and a parallel block drafter.

The network, its two shapes of drafting (chains for "mtp" and "eagle", one
block of mask rows for "parallel") and why a head costs a small fraction of a
target step are described in models/head.py; this module drafts with it.

Rollback: a sequence's head cache holds rows computed from the target's own
states only up to `fed`; whatever the head drafted past that (chained rows,
mask rows) is cut off after every step, and the states the step committed are
queued to be fed on the next draft. The drafts are verified by the target, so
a head can only change speed, never the output.

Vocabulary subset: drafted tokens always lie in the head's `vocab` (ids sorted
ascending); a sampled draft's q_draft is the request's sampling transform of
the subset logits scattered into a full-vocabulary row of -inf, so it is zero
outside the subset, sums to 1, and is exactly what the token was drawn from.

The file format is models/head_file.py.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from augury.cache import CacheGroup, KVCache, slots_for
from augury.errors import AuguryError
from augury.models.decoder import LayerWeights, OneDnnWeight, onednn_packing_available
from augury.models.low_bit import int4_matmul_available, int8_matmul_available, low_bit_weight
from augury.models.head import (
    LAYER_PREFIX,
    ROW_LIMIT,
    Head,
    HeadConfig,
    HeadWeights,
    feature_layers,
    init_own_weights,
    pick_feature,
    target_parts,
)
from augury.models.head_file import check_target, read_head
from augury.models.loader import Model
from augury.proposers.base import Draft, ProposerBase, Sequence
from augury.proposers.options import HEAD_DEFAULT_QUANT, HEAD_QUANTS
from augury.sampling import draw, probabilities, sample
from augury.verify import VerifyResult

MATMUL_FIELDS = ("wqkv", "wo", "w_gate_up", "w_down")


# -- drafting ----------------------------------------------------------------------------------------


@dataclass
class _SeqState:
    """One sequence's head state. Invariant: fed + len(pending) == len(seq.tokens) - 1."""

    cache: KVCache
    fed: int  # head rows in the cache computed from the target's own states
    pending: Tensor  # [n, H] target states of rows fed .. fed + n - 1, not fed yet
    anchor: Tensor  # [H] the target state of the last row fed (parallel heads' mask rows read it)
    tail: Tensor | None = None  # [H] the head's output at row fed - 1 (drafting with nothing pending)


class HeadProposer(ProposerBase):
    """Drafts from a head over the target's hidden states (see the module doc)."""

    needs_hidden = True
    needs_every_step = True

    def __init__(self, head: Head, meta: dict | None = None) -> None:
        self.head = head
        self.config = head.config
        self.name = head.config.kind
        self.meta = meta or {}
        self.hidden_layers = feature_layers(head.config, head.target_config)
        vocab = head.weights.vocab
        self.in_subset = torch.zeros(head.vocab_size, dtype=torch.bool, device=vocab.device)
        self.in_subset[vocab] = True
        self.states: dict[int, _SeqState] = {}
        self._forwards = 0

    @property
    def forwards(self) -> int:
        return self._forwards

    @property
    def max_k(self) -> int:
        """The longest draft: any for chains, the trained block for parallel heads."""
        return self.config.block if not self.config.chained else 1 << 30

    def start(self, seq: Sequence, prompt_hidden: Tensor | None = None) -> None:
        if prompt_hidden is None:
            raise AuguryError(f"the {self.name} head drafter needs the target's hidden states from its prefill")
        states = pick_feature(self.config, prompt_hidden, self.head.target_config.hidden_size).to(self.head.dtype)
        if states.shape[0] != len(seq.tokens) - 1:
            raise AuguryError(f"head drafter got {states.shape[0]} prompt states for {len(seq.tokens) - 1} cached tokens")
        max_len = slots_for(len(seq.tokens), seq.params.max_tokens + 2 * ROW_LIMIT)
        cache = self.head.new_cache(1, max_len)
        self.states[seq.id] = _SeqState(cache=cache, fed=0, pending=states, anchor=states[-1])

    def on_step(self, seq: Sequence, result: VerifyResult, hidden: Tensor | None) -> None:
        """Cut what was drafted past the target's own rows; queue the states this step committed."""
        state = self.states[seq.id]
        state.cache.truncate(state.fed)
        if hidden is None:
            raise AuguryError(f"the {self.name} head drafter needs the target's hidden states after every step")
        new = pick_feature(self.config, hidden, self.head.target_config.hidden_size).to(self.head.dtype)
        state.pending = torch.cat([state.pending, new]) if state.pending.numel() else new
        if state.fed + state.pending.shape[0] != len(seq.tokens) - 1:
            raise AuguryError(
                f"head drafter out of step: {state.fed + state.pending.shape[0]} states for "
                f"{len(seq.tokens) - 1} cached tokens"
            )

    def finish(self, seq: Sequence) -> None:
        self.states.pop(seq.id, None)

    def propose(self, seq: Sequence, k: int) -> Draft:
        return self.propose_batch([seq], [k])[0]

    @torch.inference_mode()
    def propose_batch(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        """Up to ks[i] tokens per sequence: one batched forward per drafted position (chains), or one in all (parallel)."""
        drafts = [Draft([]) for _ in seqs]
        states = [self.states[seq.id] for seq in seqs]
        ks = [min(k, self.max_k, s.cache.max_len - s.fed - s.pending.shape[0] - ROW_LIMIT) for s, k in zip(states, ks)]
        live = [i for i, k in enumerate(ks) if k > 0]
        if not live:
            return drafts
        tokens: dict[int, list[int]] = {i: [] for i in live}
        q_rows: dict[int, list[Tensor]] = {i: [] for i in live}
        if self.config.chained:
            self._draft_chains(seqs, states, ks, live, tokens, q_rows)
        else:
            self._draft_blocks(seqs, states, ks, live, tokens, q_rows)
        for i in live:
            drafts[i] = Draft(tokens[i], torch.stack(q_rows[i]) if q_rows[i] else None)
        return drafts

    def _draft_chains(self, seqs, states, ks, live, tokens, q_rows) -> None:
        head = self.head
        outs = self._catch_up(seqs, states, live, {i: 0 for i in live})
        y = {i: outs[i][-1] for i in live}  # [H] the head's output at the last committed row
        while live:
            logits = head.logits(torch.stack([y[i] for i in live]))
            more = [i for i, row in zip(live, logits) if self._pick(seqs[i], row, tokens[i], q_rows[i])
                    and len(tokens[i]) < ks[i]]
            if not more:
                break
            x = head.inputs(head.state(torch.stack([y[i] for i in more]))[:, None],
                            head.embed(torch.tensor([[tokens[i][-1]] for i in more], device=head.device)))
            out = head.layer(x, self._group([states[i] for i in more]))
            self._forwards += 1
            y.update((i, out[b, 0]) for b, i in enumerate(more))
            live = more

    def _draft_blocks(self, seqs, states, ks, live, tokens, q_rows) -> None:
        """Parallel heads: catch-up rows, then the trained block's mask rows, in one forward.

        The mask rows see each other, so each one's output depends on how many
        there are: always the block - 1 that training unrolls (objective.rollout),
        even for a shorter draft, or drafting would not be what training measured.
        A 1-token draft needs none (the committed row does not see them).
        """
        outs = self._catch_up(seqs, states, live, {i: self.config.block - 1 if ks[i] > 1 else 0 for i in live})
        for i in live:
            rows = outs[i]
            logits = self.head.logits(rows)  # [1 + k - 1, N]: the anchor's row, then each mask row's
            for row in logits:
                if not self._pick(seqs[i], row, tokens[i], q_rows[i]) or len(tokens[i]) >= ks[i]:
                    break
            states[i].cache.truncate(states[i].fed)

    def _catch_up(self, seqs, states, live, masks: dict[int, int]) -> dict[int, Tensor]:
        """Feed every live sequence's pending target rows (and `masks[i]` mask rows after them).

        Returns per sequence the head's outputs [1 + masks[i], H]: its last
        committed row's (computed now, or kept from the last draft when nothing
        was pending), then the mask rows'. Short blocks of several sequences run
        as one batch; long ones (a prompt) alone. The cache keeps the committed
        rows and, until `on_step`, the mask rows.
        """
        head = self.head
        blocks = {}
        for i in live:
            s = states[i]
            n = s.pending.shape[0]
            seq_tokens = seqs[i].tokens
            x = head.inputs(s.pending[None], head.embed(torch.tensor([seq_tokens[s.fed + 1 : s.fed + 1 + n]],
                                                                     device=head.device)))[0] if n else None
            if masks[i]:
                anchor = (s.pending[-1] if n else s.anchor).expand(masks[i], -1)
                xm = head.inputs(anchor[None], head.weights.mask[: masks[i]][None].to(head.dtype))[0]
                x = xm if x is None else torch.cat([x, xm])
            blocks[i] = (x, n)
        out: dict[int, Tensor] = {}
        short = [i for i in live if blocks[i][0] is not None and blocks[i][0].shape[0] <= ROW_LIMIT]
        groups = [short] + [[i] for i in live if i not in short and blocks[i][0] is not None]
        for group in [g for g in groups if g]:
            width = max(blocks[i][0].shape[0] for i in group)
            x = torch.stack([F.pad(blocks[i][0], (0, 0, 0, width - blocks[i][0].shape[0])) for i in group])
            mask = torch.stack([_block_visibility(blocks[i][1], masks[i], width, x.device) for i in group])
            caches = [states[i].cache for i in group]
            y = head.layer(x, self._group([states[i] for i in group]), block_mask=mask)
            self._forwards += 1
            for b, i in enumerate(group):
                n, m = blocks[i][1], masks[i]
                caches[b].truncate(states[i].fed + n + m)  # drop the padding rows
                out[i] = y[b, max(n - 1, 0) : n + m]
        for i in live:
            s = states[i]
            n, m = blocks[i][1], masks[i]
            if n:
                s.anchor = s.pending[-1]
                s.tail = out[i][0]
                s.fed += n
                s.pending = s.pending[:0]
            else:  # nothing new since the last draft: the committed row's output was kept
                if s.tail is None:
                    raise AuguryError("head drafter has no state to draft from (no target states yet)")
                out[i] = torch.cat([s.tail[None], out[i]]) if m else s.tail[None]
        return out

    def _group(self, states: list[_SeqState]) -> KVCache | CacheGroup:
        return states[0].cache if len(states) == 1 else CacheGroup([s.cache for s in states])

    def _pick(self, seq: Sequence, logits: Tensor, tokens: list[int], q_rows: list[Tensor]) -> bool:
        """Choose the next drafted token from subset logits [N]; False when nothing in the subset can be drafted.

        The subset logits go into a full-vocabulary row of -inf, through the
        request's own sampling transform: q_draft is zero outside the subset
        and is exactly the distribution the token is drawn from.
        """
        params = seq.params
        vocab = self.head.weights.vocab
        if params.greedy and not params.has_penalties and params.min_tokens == 0:
            # No transform changes the argmax, and the subset is ascending: its first maximum is the
            # full row's (what `probabilities` would pick), without building a vocabulary-wide row.
            tokens.append(int(vocab[logits.argmax()]))
            return True
        full = torch.full((1, self.head.vocab_size), float("-inf"), device=logits.device)
        full[0, vocab] = logits.float()
        q_row = probabilities(full, params, seq.prompt, seq.output, tokens)[0]
        if params.greedy:
            token = int(q_row.argmax())
        elif float(q_row[vocab].sum()) < 0.5:  # every subset token masked (min_tokens on a subset of EOS ids)
            return False
        elif params.coupled:
            # the target's own noise at this output position: the token the target would pick if its
            # distribution were q_draft (coupled verification needs no q_draft)
            token = draw(q_row, seq, len(seq.output) + len(tokens))
        else:
            token = int(sample(q_row[None], seq.generator)[0])
        if not self.in_subset[token]:
            return False
        tokens.append(token)
        if not params.greedy and not params.coupled:
            q_rows.append(q_row)
        return True


def _block_visibility(n: int, masks: int, width: int, device: torch.device) -> Tensor:
    """[width, width] visibility for n committed rows, then `masks` mask rows, then padding.

    Committed rows are causal; mask rows see every committed row and every mask
    row (the non-causal block); padding rows see everything before them and
    nobody real sees them.
    """
    vis = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    vis[n : n + masks, : n + masks] = True
    return vis


# -- building drafters ---------------------------------------------------------------------


def head_weights(
    own: dict[str, Tensor], vocab: Tensor, target: Model, *, dtype: torch.dtype | None = None, pack: bool = True,
    quant: str = "none",
) -> HeadWeights:
    """HeadWeights for drafting: the head's own tensors in the target's dtype (packed for oneDNN where that
    runs), the target's embedding and final norm shared, its output rows at `vocab` copied once.

    quant: "int8" or "int4" keeps the matmul weights (fc, the layer's, the output rows) in that format
    for drafting's few rows (a drafted token reads the head's bytes once: fewer bytes, a cheaper draft;
    the target verifies, so the output stays exact); "none" keeps the dtype.
    """
    if quant not in HEAD_QUANTS:
        raise AuguryError(f"unknown head weight format '{quant}' (choose from {', '.join(HEAD_QUANTS)})")
    embed, final_norm, lm_head = target_parts(target)
    dtype = dtype or target.decoder.dtype
    device = target.decoder.device
    vocab = vocab.to(device=device, dtype=torch.long)
    packing = pack and onednn_packing_available(dtype, device)
    if quant == "int4" and not int4_matmul_available(dtype, device):
        quant = "int8"  # torch's int4 kernel is CPU-only
    fused = quant != "none" and int8_matmul_available(dtype, device)

    def matmul(t: Tensor):
        t = t.to(device=device, dtype=dtype).contiguous()
        dense = OneDnnWeight(t) if packing else t
        return dense if quant == "none" else low_bit_weight(dense, quant, fused=fused)

    def plain(name: str, t: Tensor) -> Tensor:  # norms in fp32 (as the decoder keeps them), biases in dtype
        return t.to(device=device, dtype=torch.float32 if name.endswith("norm") else dtype)

    layer = {}
    for f in fields(LayerWeights):
        value = own.get(LAYER_PREFIX + f.name)
        if value is not None:
            layer[f.name] = matmul(value) if f.name in MATMUL_FIELDS else plain(f.name, value)
    return HeadWeights(
        fc=matmul(own["fc"]), state_norm=plain("norm", own["state_norm"]), token_norm=plain("norm", own["token_norm"]),
        layer=LayerWeights(**layer), embed=embed, final_norm=final_norm,
        lm_head=matmul(lm_head[vocab]), vocab=vocab,
        mask=plain("mask", own["mask"]) if "mask" in own else None, dtype=dtype,
    )


def make_proposer(config: HeadConfig, own: dict[str, Tensor], vocab: Tensor, target: Model,
                  meta: dict | None = None, quant: str = "none") -> HeadProposer:
    """A drafter over `target` from a head's own weights and vocabulary (ids; sorted here), its matmul
    weights in `quant` (head_weights)."""
    return HeadProposer(Head(config, target.config, head_weights(own, vocab.sort().values, target, quant=quant)),
                        meta)


def untrained_proposer(kind: str, target: Model, *, vocab: Tensor | None = None, seed: int = 0,
                       **overrides) -> HeadProposer:
    """A freshly initialized head drafter (for tests and as training's baseline); vocab defaults to every token."""
    config = HeadConfig.for_kind(kind, **overrides)
    vocab = torch.arange(target.config.vocab_size) if vocab is None else vocab
    return make_proposer(config, init_own_weights(config, target, seed), vocab, target)


def load_head(path: str | Path, target: Model, *, draft_vocab: int = 0, expect_kind: str | None = None,
              check_hash: bool = True, quant: str = "none") -> HeadProposer:
    """A drafter from a head file, for this target only (hash checked); draft_vocab > 0 keeps the N most
    frequent; quant: its matmul weights' format (head_weights)."""
    meta, tensors = read_head(path)
    if expect_kind is not None and meta["kind"] != expect_kind:
        raise AuguryError(f"head file {path} holds a '{meta['kind']}' head, not '{expect_kind}' "
                          f"(use --draft-method {meta['kind']})")
    if check_hash:
        check_target(meta, target, path)
    config = HeadConfig.from_dict({**meta.get("config", {}), "kind": meta["kind"]})
    vocab, counts = tensors.pop("vocab"), tensors.pop("vocab_counts", None)
    hidden = target.config.hidden_size
    if tensors["fc"].shape != (hidden, 2 * hidden) or int(vocab.max()) >= target.config.vocab_size:
        raise AuguryError(f"head file {path} does not fit this target's shape (hidden {hidden}, "
                          f"vocabulary {target.config.vocab_size})")
    if draft_vocab < 0:
        raise AuguryError(f"draft vocabulary must be >= 0 (0 = the head's own), got {draft_vocab}")
    if 0 < draft_vocab < vocab.numel():
        order = counts.argsort(descending=True, stable=True) if counts is not None else torch.arange(vocab.numel())
        vocab = vocab[order[:draft_vocab]].sort().values
    return make_proposer(config, tensors, vocab, target, meta, quant)


def build(target: Model, options, kind: str | None = None) -> HeadProposer:
    """The registry's builder: options.head names the file (options.draft_vocab optionally narrows its vocabulary)."""
    path = getattr(options, "head", None)
    method = kind or "head"
    if not path:
        raise AuguryError(f"--draft-method {method} needs --head FILE (train one with `augury train --kind "
                          f"{kind or 'eagle'}`)")
    quant = getattr(options, "draft_quant", "auto")
    quant = HEAD_DEFAULT_QUANT if quant == "auto" else quant
    if quant not in HEAD_QUANTS:
        raise AuguryError(f"--draft-quant {quant} does not apply to a trained head (choose from auto, "
                          f"{', '.join(HEAD_QUANTS)})")
    return load_head(path, target, draft_vocab=int(getattr(options, "draft_vocab", 0) or 0), expect_kind=kind,
                     quant=quant)


def build_mtp(target: Model, options) -> HeadProposer:
    return build(target, options, "mtp")


def build_eagle(target: Model, options) -> HeadProposer:
    return build(target, options, "eagle")


def build_parallel(target: Model, options) -> HeadProposer:
    return build(target, options, "parallel")
