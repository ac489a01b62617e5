"""Training a head within a time budget: collect, train, checkpoint, resume, measure, write.

    augury train --model M --kind mtp|eagle|parallel --hours H --out DIR

1. corpus: the target writes and answers requests (corpus.py), plus --data;
   the writing gets `collect_share` of the budget.
2. features: one target prefill per sequence gives the states the head reads
   and the target's top-k log-probabilities (features.py).
3. vocabulary: the N most frequent tokens of the training split (next tokens
   and the target's top-1 choices), N = --draft-vocab at most.
4. training until the budget (or --max-steps) is spent, on the same `Head`
   code the drafter runs: soft cross-entropy against the target's top-k
   (self-distillation), plus a smooth-L1 state loss for EAGLE, over
   `train_depth` chained positions (the head's own states fed back, as when
   drafting) or, for parallel heads, over blocks of mask rows at sampled anchors.
5. the held-out acceptance estimate by position: at every held-out anchor the
   head drafts as it would, and position d counts where positions 1..d-1 were
   the target's greedy choices (and the text continued with them).
6. the head file, written atomically with its description (heads.save_head).

Everything under DIR/work survives an interruption: finished feature shards,
the manifest and the latest checkpoint (both replaced atomically). `--resume`
continues from them with a new budget.
"""

from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from augury.errors import AuguryError
from augury.models.decoder import LayerWeights, ModelConfig
from augury.models.loader import Model
from augury.proposers.heads import (
    LAYER_PREFIX,
    Head,
    HeadConfig,
    HeadWeights,
    feature_layers,
    init_own_weights,
    save_head,
    target_parts,
    target_sha256,
    write_atomic,
)
from augury.train import features as feats
from augury.train.features import Features, no_space

WORK = "work"
MANIFEST = "manifest.json"
CHECKPOINT = "checkpoint.pt"


# -- the trainable head ------------------------------------------------------------------------


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


# -- batches and rollouts ----------------------------------------------------------------------


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


class GrowingCache:
    """A KV cache for training: every block's keys and values are concatenated, never written in place.

    The drafting cache (`KVCache`) overwrites preallocated slots, which
    autograd cannot differentiate through once later blocks write the same
    storage; training unrolls several blocks per step, so it grows tensors
    instead. Every sequence of a batch has the same length here.
    """

    def __init__(self, batch_size: int) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None
        self.length = 0
        self.batch_size = batch_size

    @property
    def lengths(self) -> list[int]:
        return [self.length] * self.batch_size

    def write(self, layer: int, k_new: Tensor, v_new: Tensor) -> None:
        """k_new, v_new: [B, H_kv, T, D] appended after the current length."""
        self.keys = k_new if self.keys is None else torch.cat([self.keys[:, :, : self.length], k_new], dim=2)
        self.values = v_new if self.values is None else torch.cat([self.values[:, :, : self.length], v_new], dim=2)

    def view(self, layer: int, length: int) -> tuple[Tensor, Tensor]:
        return self.keys[:, :, :length], self.values[:, :, :length]

    def advance(self, n: int) -> None:
        self.length += n

    def check_room(self, n: int) -> None:
        pass


def rollout(head: Head, batch: Batch, depth: int, anchors: int | None = None,
            gen: torch.Generator | None = None) -> list[tuple[Tensor, Tensor]]:
    """The head's outputs as it would draft, for every depth 1..depth: [(y [B, A, H], anchors [A])].

    Anchor j is head row j ([state_j; embed(x_{j+1})]); depth d's output there
    predicts x_{j+d+1}, whose target distribution is stored at position j + d.
    Chains: depth d >= 2 reads the head's own state from depth d - 1 and the
    token x_{j+d}, and sees the committed rows up to j plus the same anchor's
    earlier depths (as a draft sees its own chained rows). Parallel heads:
    depth 1 is the committed row, depths 2..block come from the anchor's mask
    rows in one block that sees the committed rows up to j and itself.
    anchors: parallel heads sample that many anchors per window (None: all).
    """
    c = head.config
    b, t = batch.tokens.shape
    rows = t - 1
    device = batch.tokens.device
    pos = torch.arange(rows, device=device)
    causal = torch.ones(rows, rows, dtype=torch.bool, device=device).tril()
    cache = GrowingCache(b)
    x = head.inputs(batch.states[:, :rows], head.embed(batch.tokens[:, 1:]))
    y = head.layer(x, cache, positions=pos.expand(b, rows), visible=causal.expand(b, rows, rows))
    outs = [(y, pos)]
    if c.chained:
        for d in range(2, depth + 1):
            ahead = batch.tokens[:, d:]  # x_{j+d}, zeros past the end (no label there)
            ahead = F.pad(ahead, (0, rows - ahead.shape[1]))
            x = head.inputs(head.state(outs[-1][0]), head.embed(ahead))
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
    mask_pos = (chosen[:, None] + torch.arange(1, m + 1, device=device)).reshape(-1)
    owner = torch.arange(a, device=device).repeat_interleave(m)
    seen = torch.cat([pos[None] <= chosen[owner][:, None], owner[:, None] == owner[None]], dim=1)  # [a m, rows + a m]
    y = head.layer(x, cache, positions=mask_pos.expand(b, -1), visible=seen.expand(b, -1, -1)).view(b, a, m, -1)
    outs += [(y[:, :, i], chosen) for i in range(m)]
    return outs[:depth]


def _labels(batch: Batch, anchors: Tensor, d: int) -> tuple[Tensor, Tensor]:
    """Positions holding depth d's targets [A], and which are real [B, A]."""
    at = anchors + d
    return at.clamp(max=batch.tokens.shape[1] - 1), at[None] < batch.lengths[:, None]


def loss(trainable: TrainableHead, batch: Batch, depth: int, feature_loss: float, anchors: int | None,
         gen: torch.Generator | None) -> tuple[Tensor, float]:
    """Mean over depths of the soft cross-entropy against the target's top-k (renormalized over the
    subset), plus feature_loss x smooth-L1 to the target's next state; also returns depth 1's top-1 accuracy."""
    head = trainable.head
    total = torch.zeros((), device=batch.tokens.device)
    top1 = 0.0
    for d, (y, anchor) in enumerate(rollout(head, batch, depth, anchors, gen), start=1):
        at, real = _labels(batch, anchor, d)
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
             batch_size: int = 2) -> dict:
    """Held-out acceptance by position (greedy): alpha[d-1] = P(position d is the target's top-1 | 1..d-1 were,
    and the text went on with them), at the anchors a drafter drafts from (inside the answer: a
    prompt's fixed template would be memorized, not predicted). Also the counts behind each, and the
    implied tau at K = depth."""
    device = trainable.vocab.device
    hits = [0] * depth
    trials = [0] * depth
    for i in range(0, len(seqs), batch_size):
        batch = make_batch(data, seqs[i : i + batch_size], seq_len, None, device)
        b, t = batch.tokens.shape
        # the chain so far was accepted; drafting starts once the answer does (anchor = last committed row)
        going = torch.arange(t - 1, device=device)[None] >= batch.starts[:, None] - 1
        for d, (y, anchor) in enumerate(rollout(trainable.head, batch, depth), start=1):
            at, real = _labels(batch, anchor, d)
            best = batch.topk_ids[:, at, 0]
            drafted = trainable.vocab[trainable.head.logits(y).argmax(-1)]
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


# -- the budgeted loop -------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainPlan:
    """Optimization settings (the CLI's flags)."""

    seq_len: int = 512
    batch: int = 4
    lr: float = 1e-3
    warmup: int = 30
    max_steps: int = 0  # 0: until the time runs out
    eval_depth: int = 4  # chained heads: positions measured (parallel heads: their block)
    anchors: int = 32  # parallel heads: anchors per window per step
    topk: int = 8
    draft_vocab: int = 32768
    holdout: float = 0.05
    checkpoint_every_s: float = 120.0
    save_dtype: str = "bf16"
    seed: int = 0


class ProgressBar:
    """A tqdm bar over a fraction of the work (time or steps, whichever is further), so its ETA is the budget's."""

    def __init__(self, desc: str, enabled: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=1000, desc=desc, file=sys.stderr, disable=not enabled, leave=True,
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| {elapsed}<{remaining} {postfix}")
        self.shown = 0.0

    def update(self, fraction: float, **postfix) -> None:
        now = time.monotonic()
        if now - self.shown < 0.5 and fraction < 1.0:
            return
        self.shown = now
        self.bar.n = min(1000, int(1000 * fraction))
        self.bar.set_postfix(postfix, refresh=True)

    def close(self) -> None:
        self.bar.close()


def _lr(plan: TrainPlan, step: int, fraction: float) -> float:
    warm = min(1.0, (step + 1) / max(1, plan.warmup))
    return plan.lr * warm * (0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, fraction))))


def _save_checkpoint(path: Path, state: dict) -> None:
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    try:
        write_atomic(path, buffer.getvalue())
    except OSError as exc:
        raise no_space(exc, path, "the previous checkpoint is kept; --resume continues from it") from None


def choose_vocab(data: Features, seqs: list[int], size: int) -> tuple[Tensor, Tensor]:
    """The `size` most frequent of the tokens the head must predict (next tokens and the target's top-1s)
    over the training split, ids ascending; and their counts."""
    vocab_size = int(max(data.tokens.max(), data.topk_ids.max())) + 1
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for s in seqs:
        lo, hi = data.span(s)
        counts += torch.bincount(data.tokens[lo:hi], minlength=vocab_size)
        counts += torch.bincount(data.topk_ids[lo:hi, 0], minlength=vocab_size)
    seen = int((counts > 0).sum())
    keep = counts.argsort(descending=True, stable=True)[: max(1, min(size, seen))]
    vocab = keep.sort().values
    return vocab, counts[vocab]


def split(data: Features, holdout: float) -> tuple[list[int], list[int]]:
    """Sequences for training and the held-out ones (every k-th, at least one when there are two or more)."""
    n = data.num_sequences
    if n < 2:
        raise AuguryError(f"the corpus has {n} sequence(s); training needs at least 2 (one is held out)")
    every = max(2, round(1 / holdout)) if holdout > 0 else n + 1
    held = [s for s in range(n) if s % every == every - 1] or [n - 1]
    return [s for s in range(n) if s not in held], held


def fit(
    trainable: TrainableHead,
    optimizer: torch.optim.Optimizer,
    data: Features,
    train_ids: list[int],
    plan: TrainPlan,
    *,
    deadline: float,
    first_step: int = 0,
    on_step=None,
    checkpoint=None,
) -> int:
    """Optimize until the deadline (time.monotonic) or plan.max_steps more steps; returns the step count reached.

    on_step(step, fraction done, running loss, running depth-1 top-1); checkpoint(step, seconds) every
    plan.checkpoint_every_s. The learning rate warms up, then follows a cosine over the budget.
    """
    config = trainable.head.config
    depth = config.train_depth if config.chained else config.block
    device = trainable.vocab.device
    gen = torch.Generator().manual_seed(plan.seed + first_step)
    t0 = last_checkpoint = time.monotonic()
    step, done, order = first_step, 0, []
    running: tuple[float, float] | None = None
    params = list(trainable.params.values())
    while True:
        fraction = max((time.monotonic() - t0) / max(1e-9, deadline - t0),
                       done / plan.max_steps if plan.max_steps else 0.0)
        if fraction >= 1.0:
            return step
        if len(order) < plan.batch:
            order += torch.randperm(len(train_ids), generator=gen).tolist()
        picked = [train_ids[order.pop()] for _ in range(min(plan.batch, len(order)))]
        batch = make_batch(data, picked, plan.seq_len, gen, device)
        for group in optimizer.param_groups:
            group["lr"] = _lr(plan, step, fraction)
        value, top1 = loss(trainable, batch, depth, config.feature_loss, plan.anchors, gen)
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        done += 1
        value = float(value.detach())
        running = (value, top1) if running is None else (0.95 * running[0] + 0.05 * value,
                                                         0.95 * running[1] + 0.05 * top1)
        if on_step is not None:
            on_step(step, fraction, *running)
        if checkpoint is not None and time.monotonic() - last_checkpoint >= plan.checkpoint_every_s:
            checkpoint(step, time.monotonic() - t0)
            last_checkpoint = time.monotonic()


def new_optimizer(trainable: TrainableHead, plan: TrainPlan) -> torch.optim.Optimizer:
    return torch.optim.AdamW(list(trainable.params.values()), lr=plan.lr, weight_decay=0.0, betas=(0.9, 0.95))


@dataclass
class Outcome:
    """What a run measured, for the CLI's summary."""

    path: Path
    steps: int
    seconds: float
    alpha: list[float]
    alpha_untrained: list[float]
    tau: float
    tokens: int
    sequences: int
    disk_bytes: int
    notes: list[str] = field(default_factory=list)


def train(
    target: Model,
    config: HeadConfig,
    out: Path,
    *,
    hours: float,
    plan: TrainPlan,
    data_paths: list[str] = (),
    generate: bool = True,
    max_sequences: int | None = None,
    collect_share: float = 0.4,
    corpus_plan=None,
    resume: bool = False,
    device: str = "cpu",
    progress: bool = True,
    log=print,
) -> Outcome:
    """The whole `augury train` run (see the module doc); returns what it measured."""
    from augury.train import corpus as corpora

    t_start = time.monotonic()
    budget = hours * 3600.0
    if budget <= 0:
        raise AuguryError(f"--hours must be positive, got {hours}")
    if not 0.0 <= collect_share < 1.0:
        raise AuguryError(f"the corpus share of the budget must be in [0, 1), got {collect_share}")
    torch_device = torch.device(device)
    out = Path(out).expanduser()
    work = out / WORK
    manifest_path = work / MANIFEST
    if manifest_path.exists() and not resume:
        raise AuguryError(f"{out} already holds a training run; pass --resume to continue it or choose another --out")
    if resume and not manifest_path.exists():
        raise AuguryError(f"--resume: {out} holds no training run to continue")
    try:
        work.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AuguryError(f"cannot create {work}: {exc.strerror}") from None
    sha = target_sha256(target)
    target_info = {"name": target.name, "sha256": sha, "arch": target.config.arch,
                   "hidden_size": target.config.hidden_size, "vocab_size": target.config.vocab_size,
                   "num_layers": target.config.num_layers, "config": target.config.to_dict()}

    if resume:
        manifest = json.loads(manifest_path.read_text())
        if manifest["target"]["sha256"] != sha:
            raise AuguryError(f"--resume: {out} was collected for target '{manifest['target']['name']}', "
                              f"not '{target.name}' (their weights differ)")
        if manifest["config"]["kind"] != config.kind:
            raise AuguryError(f"--resume: {out} trains a '{manifest['config']['kind']}' head, not '{config.kind}'")
        config = HeadConfig.from_dict(manifest["config"])
        log(f"resuming: {len(manifest['shards'])} feature shards, {manifest['tokens']} tokens")
    else:
        manifest = {"target": target_info, "config": config.to_dict(), "shards": [], "sources": [],
                    "tokens": 0, "sequences": 0, "collect_seconds": 0.0, "corpus_tokens_per_hour": None}
        # -- corpus and features -----------------------------------------------------------
        given = corpora.Corpus()
        for path in data_paths:
            part = corpora.read_data(path, target, plan.seq_len)
            given.sequences += part.sequences
            given.description += part.description
        writer = feats.ShardWriter(work)
        sources = list(given.description)
        done = {"tokens": 0, "sequences": 0}
        collect_deadline = t_start + budget * collect_share
        if generate:
            bar = ProgressBar("writing the corpus", progress)
            t0 = time.monotonic()
            written = corpora.self_corpus(
                target, corpus_plan or corpora.SelfCorpusPlan(seed=plan.seed), deadline=collect_deadline,
                max_sequences=max_sequences, recorder=corpora.StateRecorder(feature_layers(config, target.config)),
                on_sequence=lambda n, tokens: bar.update(
                    max((time.monotonic() - t0) / max(1e-9, collect_deadline - t0),
                        n / max_sequences if max_sequences else 0.0), sequences=n, tokens=tokens),
            )
            bar.close()
            seconds = time.monotonic() - t0
            sources = written.description + sources
            manifest["corpus_tokens_per_hour"] = round(written.tokens / max(seconds, 1e-9) * 3600)
            for ids, states, start in zip(written.sequences, written.states, written.starts):
                added = (feats.add_recorded(writer, target, config, ids, states, plan.topk, start)
                         if states is not None else 0)
                done["tokens"] += added
                done["sequences"] += added > 0
            try:
                write_atomic(work / "corpus.jsonl", "".join(json.dumps(t) + "\n" for t in written.texts).encode())
            except OSError as exc:
                raise no_space(exc, work / "corpus.jsonl", "nothing collected yet is lost but this text") from None
        if given.sequences:
            bar = ProgressBar("collecting target states", progress)

            def tick(n: int) -> None:
                done["tokens"] += n
                done["sequences"] += 1
                bar.update(done["sequences"] / len(given.sequences), tokens=done["tokens"])

            # text the target did not write takes one prefill per sequence; never more than a
            # further fifth of the budget, so that training keeps its time
            feats.collect(target, given.sequences, config, writer, topk=plan.topk, progress=tick,
                          deadline=max(collect_deadline, time.monotonic()) + 0.2 * budget)
            bar.close()
        shards = writer.flush()
        if not shards:
            raise AuguryError("the corpus is empty: no --data given and the target wrote nothing in the time given")
        manifest.update(
            shards=[p.name for p in shards], sources=sources, tokens=done["tokens"],
            sequences=done["sequences"], collect_seconds=round(time.monotonic() - t_start, 1),
        )
        _write_manifest(manifest_path, manifest)

    data = feats.load([work / name for name in manifest["shards"]])
    train_ids, held_ids = split(data, plan.holdout)
    eval_depth = plan.eval_depth if config.chained else config.block
    checkpoint_path = work / CHECKPOINT
    state = None
    if resume and checkpoint_path.exists():
        try:
            state = torch.load(checkpoint_path, weights_only=False)
        except Exception as exc:  # a checkpoint is written atomically, so this is outside damage
            raise AuguryError(f"--resume: checkpoint {checkpoint_path} is unreadable ({exc})") from None
    if state is not None:
        vocab, counts = state["vocab"], state["counts"]
        own = state["own"]
    else:
        vocab, counts = choose_vocab(data, train_ids, plan.draft_vocab)
        own = init_own_weights(config, target, seed=plan.seed)
    embed, final_norm, lm_head = target_parts(target)
    trainable = TrainableHead(config, target.config, own, (embed, final_norm, lm_head), vocab, torch_device)
    optimizer = new_optimizer(trainable, plan)
    step, trained_s = 0, 0.0
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        step, trained_s = state["step"], state["seconds"]
        untrained = state["untrained"]
    else:
        untrained = evaluate(trainable, data, held_ids, eval_depth, plan.seq_len)
        log(f"untrained head: held-out alpha by position {untrained['alpha']}")

    t_train = time.monotonic()
    bar = ProgressBar(f"training {config.kind}", progress)

    def checkpoint(step_now: int, seconds: float) -> None:
        _save_checkpoint(checkpoint_path, _checkpoint(trainable, optimizer, step_now, trained_s + seconds,
                                                      vocab, counts, untrained))

    try:
        step = fit(trainable, optimizer, data, train_ids, plan, deadline=t_start + budget, first_step=step,
                   on_step=lambda n, fraction, value, top1: bar.update(fraction, step=n, loss=f"{value:.3f}",
                                                                       top1=f"{top1:.2f}"),
                   checkpoint=checkpoint)
    finally:
        bar.close()
    trained_s += time.monotonic() - t_train
    checkpoint(step, 0.0)
    measured = evaluate(trainable, data, held_ids, eval_depth, plan.seq_len)
    log(f"trained head ({step} steps): held-out alpha by position {measured['alpha']} (untrained "
        f"{untrained['alpha']}), tau at K={eval_depth} about {measured['tau']}")

    held_tokens = sum(data.span(s)[1] - data.span(s)[0] for s in held_ids)
    meta = {
        "kind": config.kind,
        "config": config.to_dict(),
        "target": target_info,
        "vocab_size": int(vocab.numel()),
        "data": {"sources": manifest["sources"], "sequences": manifest["sequences"], "tokens": manifest["tokens"],
                 "heldout_sequences": len(held_ids), "heldout_tokens": held_tokens,
                 "corpus_tokens_per_hour": manifest.get("corpus_tokens_per_hour")},
        "train": {"steps": step, "seconds": round(trained_s, 1), "collect_seconds": manifest["collect_seconds"],
                  "device": str(torch_device), **{k: v for k, v in asdict(plan).items()
                                                  if k in ("seq_len", "batch", "lr", "topk", "anchors", "seed")}},
        "alpha": measured["alpha"],
        "alpha_counts": {"hits": measured["hits"], "trials": measured["trials"]},
        "alpha_untrained": untrained["alpha"],
        "tau_estimate": measured["tau"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    save_dtype = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}.get(plan.save_dtype)
    if save_dtype is None:
        raise AuguryError(f"unknown --save-dtype '{plan.save_dtype}' (choose from bf16, fp16, fp32)")
    try:
        # the target's final norm goes along for `augury export-head` (drafting reads the target's own)
        path = save_head(out, {**trainable.own(), "target.final_norm": final_norm.float().cpu()}, vocab, counts, meta,
                         dtype=save_dtype)
    except OSError as exc:
        raise no_space(exc, out, f"the checkpoint in {work} is kept; --resume writes the head again") from None
    disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return Outcome(path=path, steps=step, seconds=trained_s, alpha=measured["alpha"],
                   alpha_untrained=untrained["alpha"], tau=measured["tau"], tokens=manifest["tokens"],
                   sequences=manifest["sequences"], disk_bytes=disk)


def _checkpoint(trainable: TrainableHead, optimizer, step: int, seconds: float, vocab: Tensor, counts: Tensor,
                untrained: dict) -> dict:
    return {"own": trainable.own(), "optimizer": optimizer.state_dict(), "step": step, "seconds": seconds,
            "vocab": vocab, "counts": counts, "untrained": untrained}


def _write_manifest(path: Path, manifest: dict) -> None:
    try:
        write_atomic(path, json.dumps(manifest, indent=1).encode())
    except OSError as exc:
        raise no_space(exc, path, "the feature shards are kept") from None
