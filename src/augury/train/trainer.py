"""Training a head within a time budget: plan, collect, train, checkpoint, resume, measure, write.

    augury train --model M --kind mtp|eagle|parallel --hours H --out DIR

1. the plan is checked whole before any work (flags, output folder, resume).
2. corpus and features (collection.py): chat-shaped samples of the Python
   standard library by default, and any --data, read by batched prefill; the
   target's own answers with --corpus self. Its share of the budget is
   `CorpusPlan.share`.
3. vocabulary: the N most frequent tokens of the training split (next tokens
   and the target's top-1 choices), N = --draft-vocab at most.
4. training until the budget (or --max-steps) is spent, on the same `Head`
   code the drafter runs (objective.py): soft cross-entropy against the
   target's top-k (distillation), a smooth-L1 state loss for EAGLE, noise on
   the states read and dropout, AdamW with weight decay, over `train_depth`
   chained positions or, for parallel heads, blocks of mask rows.
5. held-out acceptance by position at token milestones (`TrainPlan.curve_at`),
   so one run gives alpha against tokens seen, and at the end.
6. the head file, written atomically with its description (models/head_file.py).

Everything under DIR/work survives an interruption: finished feature shards,
the manifest and the latest checkpoint (both replaced atomically). `--resume`
continues from them with a new budget.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from augury.errors import AuguryError
from augury.files import write_atomic
from augury.models.head import HeadConfig, init_own_weights, target_parts
from augury.models.head_file import save_head, target_sha256
from augury.models.loader import Model
from augury.train import features as feats
from augury.train.collection import CorpusPlan, collect_corpus
from augury.train.features import Features, no_space
from augury.train.objective import Regularization, TrainableHead, evaluate, loss, make_batch
from augury.train.precision import COMPUTE_DTYPES, Precision, choose_precision
from augury.train.progress import ProgressBar

WORK = "work"
MANIFEST = "manifest.json"
CHECKPOINT = "checkpoint.pt"
SAVE_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


@dataclass(frozen=True)
class TrainPlan:
    """Optimization settings (the CLI's flags), checked when made."""

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
    train_dtype: str = "auto"  # the step's matmuls: fp32, bf16, or auto (the faster here, measured: precision.py)
    seed: int = 0
    weight_decay: float = 0.01
    noise: float = 0.05  # on the states read, x their RMS
    dropout: float = 0.1
    curve_at: tuple[int, ...] = (50_000, 200_000, 500_000, 1_000_000)  # tokens seen at held-out measurements
    curve_sequences: int = 256  # held-out sequences measured at each milestone (all at the end)

    def __post_init__(self) -> None:
        if self.save_dtype not in SAVE_DTYPES:
            raise AuguryError(f"unknown --save-dtype '{self.save_dtype}' (choose from {', '.join(SAVE_DTYPES)})")
        if self.train_dtype not in COMPUTE_DTYPES:
            raise AuguryError(f"unknown --train-dtype '{self.train_dtype}' (choose from {', '.join(COMPUTE_DTYPES)})")
        if not 0 <= self.holdout < 1:
            raise AuguryError(f"--holdout must be in [0, 1), got {self.holdout}")
        if self.max_steps < 0:
            raise AuguryError(f"--max-steps must be >= 0, got {self.max_steps}")
        if not 0 <= self.dropout < 1 or self.noise < 0 or self.weight_decay < 0:
            raise AuguryError(f"--dropout must be in [0, 1) and --noise, --weight-decay >= 0 "
                              f"(got {self.dropout}, {self.noise}, {self.weight_decay})")
        if any(n <= 0 for n in self.curve_at):
            raise AuguryError(f"--curve-at takes positive token counts, got {list(self.curve_at)}")

    @property
    def regularization(self) -> Regularization:
        return Regularization(noise=self.noise, dropout=self.dropout)


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
    tokens_seen: int = 0,
    precision: Precision = Precision("fp32"),
    on_step=None,
    checkpoint=None,
    milestone=None,
) -> tuple[int, int]:
    """Optimize until the deadline (time.monotonic) or plan.max_steps more steps; returns the step count
    and the training tokens seen so far.

    on_step(step, fraction done, running loss, running depth-1 top-1); checkpoint(step, tokens seen, seconds)
    every plan.checkpoint_every_s; milestone(tokens seen) each time the tokens seen pass one of
    plan.curve_at. The learning rate warms up, then follows a cosine over the budget. The loss's
    forward runs in `precision` (the backward follows its dtypes; the parameters stay fp32).
    """
    config = trainable.head.config
    depth = config.train_depth if config.chained else config.block
    device = trainable.vocab.device
    gen = torch.Generator().manual_seed(plan.seed + first_step)
    t0 = last_checkpoint = time.monotonic()
    step, done, order = first_step, 0, []
    running: tuple[float, float] | None = None
    params = list(trainable.params.values())
    pending = sorted(n for n in plan.curve_at if n > tokens_seen)
    while True:
        fraction = max((time.monotonic() - t0) / max(1e-9, deadline - t0),
                       done / plan.max_steps if plan.max_steps else 0.0)
        if fraction >= 1.0:
            return step, tokens_seen
        if len(order) < plan.batch:
            order += torch.randperm(len(train_ids), generator=gen).tolist()
        picked = [train_ids[order.pop()] for _ in range(min(plan.batch, len(order)))]
        batch = make_batch(data, picked, plan.seq_len, gen, device)
        for group in optimizer.param_groups:
            group["lr"] = _lr(plan, step, fraction)
        with precision.autocast(device):
            value, top1 = loss(trainable, batch, depth, config.feature_loss, plan.anchors, gen, plan.regularization)
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        step += 1
        done += 1
        tokens_seen += int(batch.lengths.sum())
        value = float(value.detach())
        running = (value, top1) if running is None else (0.95 * running[0] + 0.05 * value,
                                                         0.95 * running[1] + 0.05 * top1)
        if on_step is not None:
            on_step(step, fraction, *running)
        while pending and tokens_seen >= pending[0]:
            pending.pop(0)
            if milestone is not None:
                milestone(tokens_seen)
        if checkpoint is not None and time.monotonic() - last_checkpoint >= plan.checkpoint_every_s:
            checkpoint(step, tokens_seen, time.monotonic() - t0)
            last_checkpoint = time.monotonic()


def new_optimizer(trainable: TrainableHead, plan: TrainPlan) -> torch.optim.Optimizer:
    """AdamW with decay on the matrices only (norm gains and biases keep their scale)."""
    decayed = [p for p in trainable.params.values() if p.dim() >= 2]
    kept = [p for p in trainable.params.values() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decayed, "weight_decay": plan.weight_decay},
                              {"params": kept, "weight_decay": 0.0}], lr=plan.lr, betas=(0.9, 0.95))


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
    tokens_seen: int = 0
    curve: list[dict] = field(default_factory=list)
    rates: dict = field(default_factory=dict)


def prepare_out(out: Path, resume: bool) -> Path:
    """The run's work folder, checked against --resume before any work."""
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
    return work


def target_description(target: Model) -> dict:
    c = target.config
    return {"name": target.name, "sha256": target_sha256(target), "arch": c.arch, "hidden_size": c.hidden_size,
            "vocab_size": c.vocab_size, "num_layers": c.num_layers, "config": c.to_dict()}


def resumed_manifest(work: Path, target_info: dict, config: HeadConfig, out: Path) -> dict:
    manifest = json.loads((work / MANIFEST).read_text())
    if manifest["target"]["sha256"] != target_info["sha256"]:
        raise AuguryError(f"--resume: {out} was collected for target '{manifest['target']['name']}', "
                          f"not '{target_info['name']}' (their weights differ)")
    if manifest["config"]["kind"] != config.kind:
        raise AuguryError(f"--resume: {out} trains a '{manifest['config']['kind']}' head, not '{config.kind}'")
    return manifest


def borrowed_manifest(source: Path, target_info: dict, config: HeadConfig) -> dict:
    """Another run's collected states for this head (another kind on the same data, or a second try with
    other settings): its manifest with absolute shard paths and this head's config; nothing is copied."""
    path = source / WORK / MANIFEST
    if not path.is_file():
        raise AuguryError(f"--features-from: {source} holds no collected states ({path} is missing)")
    theirs = json.loads(path.read_text())
    if theirs["target"]["sha256"] != target_info["sha256"]:
        raise AuguryError(f"--features-from: {source} was collected for target '{theirs['target']['name']}', "
                          f"not '{target_info['name']}' (their weights differ)")
    feature = theirs["config"].get("feature")
    if feature != config.feature:
        raise AuguryError(f"--features-from: {source} holds the target's {feature} states and this {config.kind} "
                          f"head reads its {config.feature} ones (pass --feature {feature})")
    shards = [source / WORK / name for name in theirs["shards"]]
    missing = [p for p in shards if not p.is_file()]
    if missing:
        raise AuguryError(f"--features-from: {source} lacks its feature shard {missing[0]}")
    return {**theirs, "config": config.to_dict(), "shards": [str(p.resolve()) for p in shards],
            "features_from": str(source.resolve())}


def train(
    target: Model,
    config: HeadConfig,
    out: Path,
    *,
    hours: float,
    plan: TrainPlan,
    corpus: CorpusPlan | None = None,
    resume: bool = False,
    features_from: Path | None = None,
    device: str = "cpu",
    progress: bool = True,
    log=print,
) -> Outcome:
    """The whole `augury train` run (see the module doc); returns what it measured. features_from: train
    on the states another run in that folder collected instead of collecting."""
    t_start = time.monotonic()
    if hours <= 0:
        raise AuguryError(f"--hours must be positive, got {hours}")
    budget = hours * 3600.0
    corpus = corpus or CorpusPlan()
    torch_device = torch.device(device)
    out = Path(out).expanduser()
    fresh = [folder for folder in (out, out / WORK) if not folder.exists()]
    work = prepare_out(out, resume)
    target_info = target_description(target)
    if resume:
        manifest = resumed_manifest(work, target_info, config, out)
        config = HeadConfig.from_dict(manifest["config"])
        log(f"resuming: {len(manifest['shards'])} feature shards, {manifest['tokens']} tokens")
    else:
        try:
            manifest = _new_manifest(target, target_info, config, work, corpus, plan, features_from,
                                     deadline=t_start + budget * corpus.share, progress=progress, log=log)
        except BaseException:
            _remove_if_empty(fresh)  # a run that failed before it wrote anything leaves no empty OUT/work/
            raise

    data = feats.load([work / name for name in manifest["shards"]])
    train_ids, held_ids = split(data, plan.holdout)
    eval_depth = plan.eval_depth if config.chained else config.block
    state = _read_checkpoint(work / CHECKPOINT) if resume else None
    if state is not None:
        vocab, counts, own = state["vocab"], state["counts"], state["own"]
    else:
        vocab, counts = choose_vocab(data, train_ids, plan.draft_vocab)
        own = init_own_weights(config, target, seed=plan.seed)
    embed, final_norm, lm_head = target_parts(target)
    trainable = TrainableHead(config, target.config, own, (embed, final_norm, lm_head), vocab, torch_device)
    optimizer = new_optimizer(trainable, plan)
    precision = choose_precision(plan.train_dtype, torch_device, target.config.hidden_size)
    log(f"training in {precision.dtype}" + (f" (matmul probe, ms: {precision.probe_ms})" if precision.probe_ms else ""))
    step, trained_s, seen, curve = 0, 0.0, 0, []
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        step, trained_s, untrained = state["step"], state["seconds"], state["untrained"]
        seen, curve = state.get("tokens_seen", 0), state.get("curve", [])
    else:
        untrained = evaluate(trainable, data, held_ids, eval_depth, plan.seq_len, precision=precision)
        log(f"untrained head: held-out alpha by position {untrained['alpha']}")

    t_train = time.monotonic()
    bar = ProgressBar(f"training {config.kind}", progress)

    def checkpoint(step_now: int, tokens_seen: int, seconds: float) -> None:
        _save_checkpoint(work / CHECKPOINT, {
            "own": trainable.own(), "optimizer": optimizer.state_dict(), "step": step_now,
            "seconds": trained_s + seconds, "vocab": vocab, "counts": counts, "untrained": untrained,
            "tokens_seen": tokens_seen, "curve": curve})

    def milestone(tokens_seen: int) -> None:
        t0 = time.monotonic()
        point = evaluate(trainable, data, held_ids[: plan.curve_sequences], eval_depth, plan.seq_len,
                         precision=precision)
        curve.append({"tokens_seen": tokens_seen, "alpha": point["alpha"], "tau": point["tau"],
                      "train_seconds": round(trained_s + t0 - t_train, 1), "trials": point["trials"]})
        _append_line(work / "curve.jsonl", curve[-1])
        log(f"\n{tokens_seen} tokens seen: held-out alpha by position {point['alpha']}, tau about {point['tau']}")

    try:
        step, seen = fit(trainable, optimizer, data, train_ids, plan, deadline=t_start + budget, first_step=step,
                         tokens_seen=seen, precision=precision, checkpoint=checkpoint, milestone=milestone,
                         on_step=lambda n, fraction, value, top1: bar.update(
                             fraction, step=n, loss=f"{value:.3f}", top1=f"{top1:.2f}"))
    finally:
        bar.close()
    trained_s += time.monotonic() - t_train
    checkpoint(step, seen, 0.0)
    measured = evaluate(trainable, data, held_ids, eval_depth, plan.seq_len, precision=precision)
    rate = round(seen / max(trained_s, 1e-9))
    log(f"trained head ({step} steps, {seen} tokens seen, {rate} tokens/s): held-out alpha by position "
        f"{measured['alpha']} (untrained {untrained['alpha']}), tau at K={eval_depth} about {measured['tau']}")

    held_tokens = sum(data.span(s)[1] - data.span(s)[0] for s in held_ids)
    meta = {
        "kind": config.kind,
        "config": config.to_dict(),
        "target": target_info,
        "vocab_size": int(vocab.numel()),
        "data": {"sources": manifest["sources"], "sequences": manifest["sequences"], "tokens": manifest["tokens"],
                 "heldout_sequences": len(held_ids), "heldout_tokens": held_tokens,
                 "tokens_per_hour": manifest.get("tokens_per_hour")},
        "train": {"steps": step, "seconds": round(trained_s, 1), "collect_seconds": manifest["collect_seconds"],
                  "tokens_seen": seen, "tokens_per_second": rate, "device": str(torch_device),
                  "dtype": precision.dtype, "dtype_probe_ms": precision.probe_ms,
                  **{k: v for k, v in asdict(plan).items()
                     if k in ("seq_len", "batch", "lr", "topk", "anchors", "seed", "weight_decay", "noise",
                              "dropout")}},
        "alpha": measured["alpha"],
        "alpha_counts": {"hits": measured["hits"], "trials": measured["trials"]},
        "alpha_untrained": untrained["alpha"],
        "curve": curve,
        "tau_estimate": measured["tau"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    try:
        # the target's final norm goes along for `augury export-head` (drafting reads the target's own)
        path = save_head(out, {**trainable.own(), "target.final_norm": final_norm.float().cpu()}, vocab, counts, meta,
                         dtype=SAVE_DTYPES[plan.save_dtype])
    except OSError as exc:
        raise no_space(exc, out, f"the checkpoint in {work} is kept; --resume writes the head again") from None
    disk = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    return Outcome(path=path, steps=step, seconds=trained_s, alpha=measured["alpha"],
                   alpha_untrained=untrained["alpha"], tau=measured["tau"], tokens=manifest["tokens"],
                   sequences=manifest["sequences"], disk_bytes=disk, tokens_seen=seen, curve=curve,
                   rates={**(manifest.get("tokens_per_hour") or {}), "train_tokens_per_second": rate})


def _new_manifest(target: Model, target_info: dict, config: HeadConfig, work: Path, corpus: CorpusPlan,
                  plan: TrainPlan, features_from: Path | None, *, deadline: float, progress: bool, log) -> dict:
    """The states a new run trains on: another run's (features_from) or collected now, their manifest written."""
    manifest_path = work / MANIFEST
    if features_from is not None:
        manifest = borrowed_manifest(Path(features_from).expanduser(), target_info, config)
        _write_manifest(manifest_path, manifest)
        log(f"training on the states collected in {features_from}: {len(manifest['shards'])} feature shards, "
            f"{manifest['tokens']} tokens")
        return manifest
    got = collect_corpus(target, config, work, corpus, seq_len=plan.seq_len, topk=plan.topk, seed=plan.seed,
                         deadline=deadline, progress=progress)
    manifest = {"target": target_info, "config": config.to_dict(), "shards": [p.name for p in got.shards],
                "sources": got.sources, "tokens": got.tokens, "sequences": got.sequences,
                "collect_seconds": got.seconds, "tokens_per_hour": got.rates}
    _write_manifest(manifest_path, manifest)
    log(f"collected {got.tokens} tokens ({got.sequences} sequences) in {got.seconds:.0f} s; "
        f"tokens an hour: {got.rates}")
    return manifest


def _remove_if_empty(folders: list[Path]) -> None:
    """Remove these folders (innermost last in the list) where they hold nothing; a folder with any file is kept."""
    for folder in reversed(folders):
        try:
            folder.rmdir()
        except OSError:
            return


def _read_checkpoint(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return torch.load(path, weights_only=False)
    except Exception as exc:  # a checkpoint is written atomically, so this is outside damage
        raise AuguryError(f"--resume: checkpoint {path} is unreadable ({exc})") from None


def _append_line(path: Path, record: dict) -> None:
    try:
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
    except OSError as exc:
        raise no_space(exc, path, "the checkpoint keeps the curve too") from None


def _write_manifest(path: Path, manifest: dict) -> None:
    try:
        write_atomic(path, json.dumps(manifest, indent=1).encode())
    except OSError as exc:
        raise no_space(exc, path, "the feature shards are kept") from None
