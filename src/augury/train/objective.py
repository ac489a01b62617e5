"""What a head is trained on and measured by: batches of corpus windows, the head's rollout as it drafts,
the loss (distillation on the target's top-k, a state loss, regularization) and held-out acceptance."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor

from augury.cache import GrowingCache
from augury.models.decoder import LayerWeights, ModelConfig
from augury.models.head import LAYER_PREFIX, Head, HeadConfig, HeadWeights
from augury.train.features import Features
from augury.train.precision import Precision


class TrainableHead:
    """A head's own weights as fp32 parameters over the target's frozen embedding, final norm and output rows.

    The parameters sit inside a `HeadWeights`, so `self.head` runs exactly the
    drafter's code; the optimizer updates them in place.
    """

    def __init__(self, config: HeadConfig, target: ModelConfig, own: dict[str, Tensor], frozen: tuple[Tensor, ...],
                 vocab: Tensor, device: torch.device) -> None:
        embed, final_norm, lm_head = frozen
        self.params = {name: torch.nn.Parameter(t.detach().to(device=device, dtype=torch.float32).clone())
                       for name, t in own.items()}
        layer = {name[len(LAYER_PREFIX):]: p for name, p in self.params.items() if name.startswith(LAYER_PREFIX)}
        self.vocab = vocab.to(device)
        weights = HeadWeights(
            fc=self.params["fc"], state_norm=self.params["state_norm"], token_norm=self.params["token_norm"],
            layer=LayerWeights(**layer), embed=embed.to(device), final_norm=final_norm.to(device, torch.float32),
            lm_head=lm_head[vocab].to(device, torch.float32), vocab=self.vocab, mask=self.params.get("mask"),
            dtype=torch.float32,
        )
        self.head = Head(config, target, weights)
        # target id -> index in the subset (-1: not in it), for the distillation targets
        self.subset_index = torch.full((target.vocab_size,), -1, dtype=torch.long, device=device)
        self.subset_index[self.vocab] = torch.arange(self.vocab.numel(), device=device)

    def own(self) -> dict[str, Tensor]:
        return {name: p.detach().cpu().clone() for name, p in self.params.items()}


@dataclass
class Batch:
    """B windows of the corpus, padded to the longest (T)."""

    tokens: Tensor  # [B, T] long
    states: Tensor  # [B, T, H] float: the target state at each position
    topk_ids: Tensor  # [B, T, k] long
    topk_p: Tensor  # [B, T, k] float: the target's probabilities of those ids
    lengths: Tensor  # [B] long: real positions per window
    starts: Tensor  # [B] long: where the drafted text (the answer) begins in each window


def make_batch(data: Features, seqs: list[int], seq_len: int, gen: torch.Generator | None,
               device: torch.device) -> Batch:
    """One window of at most seq_len tokens per sequence (a random start when it is longer; the start without gen)."""
    spans = []
    for s in seqs:
        lo, hi = data.span(s)
        if hi - lo > seq_len:
            shift = int(torch.randint(0, hi - lo - seq_len + 1, (1,), generator=gen)) if gen is not None else 0
            lo, hi = lo + shift, lo + shift + seq_len
        spans.append((lo, hi))
    starts = [max(0, int(data.offsets[s]) + int(data.starts[s]) - lo) for s, (lo, _) in zip(seqs, spans)]
    width = max(hi - lo for lo, hi in spans)

    def take(t: Tensor) -> Tensor:
        rows = []
        for lo, hi in spans:
            part = t[lo:hi]
            pad = width - part.shape[0]
            rows.append(torch.cat([part, part[-1:].expand(pad, *part.shape[1:])]) if pad else part)
        return torch.stack(rows).to(device)

    return Batch(
        tokens=take(data.tokens), states=take(data.states).float(), topk_ids=take(data.topk_ids),
        topk_p=take(data.topk_logprobs).exp(), lengths=torch.tensor([hi - lo for lo, hi in spans], device=device),
        starts=torch.tensor(starts, device=device),
    )


def rollout(head: Head, batch: Batch, depth: int, anchors: int | None = None,
            gen: torch.Generator | None = None, dropout: float = 0.0) -> list[tuple[Tensor, Tensor]]:
    """The head's outputs as it would draft, for every depth 1..depth: [(y [B, A, H], anchors [A])].

    Anchor j is head row j ([state_j; embed(x_{j+1})]); depth d's output there
    predicts x_{j+d+1}, whose target distribution is stored at position j + d.
    Chains: depth d >= 2 reads the head's own state from depth d - 1 and the
    token x_{j+d}, and sees the committed rows up to j plus the same anchor's
    earlier depths (as a draft sees its own chained rows). Parallel heads:
    depth 1 is the committed row, depths 2..block come from the anchor's mask
    rows in one block that sees the committed rows up to j and itself.
    anchors: parallel heads sample that many anchors per window (None: all).
    dropout: on the layer's input (training only; drafting runs the same code without it).
    """
    c = head.config
    b, t = batch.tokens.shape
    rows = t - 1
    device = batch.tokens.device
    pos = torch.arange(rows, device=device)
    causal = torch.ones(rows, rows, dtype=torch.bool, device=device).tril()
    cache = GrowingCache(b)
    x = F.dropout(head.inputs(batch.states[:, :rows], head.embed(batch.tokens[:, 1:])), dropout)
    y = head.layer(x, cache, positions=pos.expand(b, rows), visible=causal.expand(b, rows, rows))
    outs = [(y, pos)]
    if c.chained:
        for d in range(2, depth + 1):
            ahead = batch.tokens[:, d:]  # x_{j+d}, zeros past the end (no label there)
            ahead = F.pad(ahead, (0, rows - ahead.shape[1]))
            x = F.dropout(head.inputs(head.state(outs[-1][0]), head.embed(ahead)), dropout)
            seen = torch.zeros(rows, rows * d, dtype=torch.bool, device=device)
            seen[:, :rows] = causal
            for earlier in range(1, d):
                seen[pos, earlier * rows + pos] = True
            y = head.layer(x, cache, positions=(pos + d - 1).expand(b, rows), visible=seen.expand(b, rows, rows * d))
            outs.append((y, pos))
        return outs[:depth]
    m = c.block - 1
    if anchors is not None and anchors < rows:
        chosen = torch.randperm(rows, generator=gen)[:anchors].sort().values.to(device)
    else:
        chosen = pos
    a = chosen.numel()
    x = head.inputs(batch.states[:, chosen, None].expand(b, a, m, -1),
                    head.weights.mask[None, None].expand(b, a, m, -1)).reshape(b, a * m, -1)
    x = F.dropout(x, dropout)
    mask_pos = (chosen[:, None] + torch.arange(1, m + 1, device=device)).reshape(-1)
    owner = torch.arange(a, device=device).repeat_interleave(m)
    seen = torch.cat([pos[None] <= chosen[owner][:, None], owner[:, None] == owner[None]], dim=1)  # [a m, rows + a m]
    y = head.layer(x, cache, positions=mask_pos.expand(b, -1), visible=seen.expand(b, -1, -1)).view(b, a, m, -1)
    outs += [(y[:, :, i], chosen) for i in range(m)]
    return outs[:depth]


def labels(batch: Batch, anchors: Tensor, d: int) -> tuple[Tensor, Tensor]:
    """Positions holding depth d's targets [A], and which are real [B, A]."""
    at = anchors + d
    return at.clamp(max=batch.tokens.shape[1] - 1), at[None] < batch.lengths[:, None]


@dataclass(frozen=True)
class Regularization:
    """What keeps a head trained on a million tokens from memorising them (HASS, Hydra++ and EAGLE's
    recipes gain most in low-data regimes from these)."""

    noise: float = 0.0  # Gaussian noise on the target states the head reads, x their RMS (EAGLE: uniform noise)
    dropout: float = 0.0  # on the head layer's input


def loss(trainable: TrainableHead, batch: Batch, depth: int, feature_loss: float, anchors: int | None,
         gen: torch.Generator | None, regularization: Regularization = Regularization()) -> tuple[Tensor, float]:
    """Mean over depths of the soft cross-entropy against the target's top-k (renormalized over the
    subset), plus feature_loss x smooth-L1 to the target's next (clean) state; also returns depth 1's
    top-1 accuracy."""
    head = trainable.head
    total = torch.zeros((), device=batch.tokens.device)
    top1 = 0.0
    read = batch
    if regularization.noise:
        rms = batch.states.pow(2).mean(-1, keepdim=True).sqrt()
        noise = torch.randn(batch.states.shape, generator=gen).to(batch.states.device)
        read = replace(batch, states=batch.states + regularization.noise * rms * noise)
    for d, (y, anchor) in enumerate(rollout(head, read, depth, anchors, gen, regularization.dropout), start=1):
        at, real = labels(batch, anchor, d)
        sub = trainable.subset_index[batch.topk_ids[:, at]]  # [B, A, k]
        weight = batch.topk_p[:, at] * (sub >= 0)
        mass = weight.sum(-1)
        ok = real & (mass > 0)
        weight = weight / mass.clamp_min(1e-9)[..., None]
        logits = head.logits(y)
        logq = logits.log_softmax(-1).gather(-1, sub.clamp_min(0))
        ce = -(weight * logq).sum(-1)
        count = ok.sum().clamp_min(1)
        total = total + (ce * ok).sum() / count
        if feature_loss:
            reg = F.smooth_l1_loss(head.state(y), batch.states[:, at], reduction="none").mean(-1)
            total = total + feature_loss * (reg * real).sum() / real.sum().clamp_min(1)
        if d == 1:
            hit = trainable.vocab[logits.argmax(-1)] == batch.topk_ids[:, at, 0]
            top1 = float((hit & ok).sum()) / float(count)
    return total / depth, top1


@torch.no_grad()
def evaluate(trainable: TrainableHead, data: Features, seqs: list[int], depth: int, seq_len: int,
             batch_size: int = 2, precision: Precision = Precision("fp32")) -> dict:
    """Held-out acceptance by position (greedy): alpha[d-1] = P(position d is the target's top-1 | 1..d-1 were,
    and the text went on with them), at the anchors a drafter drafts from (inside the answer: a
    prompt's fixed template would be memorized, not predicted). Also the counts behind each, and the
    implied tau at K = depth. `precision`: the training step's (a drafter computes in bf16 by default too)."""
    device = trainable.vocab.device
    hits = [0] * depth
    trials = [0] * depth
    for i in range(0, len(seqs), batch_size):
        batch = make_batch(data, seqs[i : i + batch_size], seq_len, None, device)
        b, t = batch.tokens.shape
        # the chain so far was accepted; drafting starts once the answer does (anchor = last committed row)
        going = torch.arange(t - 1, device=device)[None] >= batch.starts[:, None] - 1
        with precision.autocast(device):
            outs = rollout(trainable.head, batch, depth)
            drafted_at = [trainable.vocab[trainable.head.logits(y).argmax(-1)] for y, _ in outs]
        for d, ((y, anchor), drafted) in enumerate(zip(outs, drafted_at), start=1):
            at, real = labels(batch, anchor, d)
            best = batch.topk_ids[:, at, 0]
            tried = going & real
            hit = tried & (drafted == best)
            hits[d - 1] += int(hit.sum())
            trials[d - 1] += int(tried.sum())
            follows = batch.tokens[:, (at + 1).clamp(max=t - 1)] == best  # the text continued with that choice
            going = hit & follows & ((at + 1)[None] < batch.lengths[:, None])
    alpha = [h / n if n else 0.0 for h, n in zip(hits, trials)]
    tau, reach = 1.0, 1.0
    for a in alpha:
        reach *= a
        tau += reach
    return {"alpha": [round(a, 4) for a in alpha], "hits": hits, "trials": trials, "tau": round(tau, 3)}
