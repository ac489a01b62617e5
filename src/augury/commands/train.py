"""`augury train`: a drafter head for a target, trained here; `augury export-head`: its speculators layout."""

from __future__ import annotations

import argparse
import math
from functools import partial

from augury.errors import AuguryError
from augury.models.store import DEFAULT_TARGET

KINDS = ("mtp", "eagle", "parallel")


def _positive(kind):
    def parse(text: str):
        value = _finite(text) if kind is float else _number(kind, text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value

    return parse


def _number(kind, text: str):
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _finite(text: str) -> float:
    """A float option: nan and inf are refused here (`--hours inf` was a run without a time limit)."""
    value = _number(float, text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "train",
        help="train an MTP, EAGLE or parallel drafter head for a target (CPU or GPU, time-budgeted)",
        description="Collects the target's hidden states and top-k log-probabilities over a corpus by batched "
        "prefill (by default chat-shaped samples of this machine's Python standard library, PSF licence; "
        "--corpus self adds the target's own answers; --data adds yours), trains a one-layer head within "
        "--hours, measures held-out acceptance by position at token milestones, and writes "
        "DIR/head.safetensors with its description (DIR/head.json): target name and hash, kind, vocabulary "
        "subset, data, rates, the acceptance curve. Draft with it through --draft-method KIND --head DIR.",
    )
    p.add_argument("--model", "-m", default=DEFAULT_TARGET, help=f"target model name or path (default {DEFAULT_TARGET})")
    p.add_argument("--kind", required=True, choices=KINDS, help="head kind")
    p.add_argument("--hours", required=True, type=_positive(float), help="time budget for the whole run")
    p.add_argument("--out", required=True, help="folder for the head (and its work files: features, checkpoint)")
    p.add_argument("--data", action="append", default=[],
                   help="extra corpus: a JSONL file ({\"messages\": [...]} or {\"text\": ...} per line) or a folder "
                   "of .txt/.md files (repeatable)")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]: where the target and training run")
    p.add_argument("--dtype", default="bf16", help="the target's dtype while collecting (default bf16)")
    p.add_argument("--offline", action="store_true", help="never download the target")
    p.add_argument("--resume", action="store_true", help="continue the run in --out (its corpus and checkpoint)")
    c = p.add_argument_group("corpus")
    c.add_argument("--features-from", default=None, metavar="DIR",
                   help="train on the states another run collected (DIR of an earlier `augury train`, same target "
                   "and --feature) instead of collecting: another head kind or other settings on the same data")
    c.add_argument("--corpus", default="stdlib",
                   help="comma-separated sources: stdlib (the Python standard library, read by prefill; default), "
                   "stdlib-tests (its test suites: about as much code again), self (the target writes requests "
                   "and answers: on-policy, one token per step), or none (--data only)")
    c.add_argument("--corpus-tokens", type=_positive(int), default=None,
                   help="stop collecting after this many tokens (default: when the corpus share of --hours ends)")
    c.add_argument("--sequences", type=_positive(int), default=None,
                   help="self: stop writing after this many conversations")
    c.add_argument("--collect-share", type=_finite, default=0.4,
                   help="share of --hours for collecting (default 0.4)")
    c.add_argument("--request-tokens", type=_positive(int), default=96, help="self: longest request (default 96)")
    c.add_argument("--answer-tokens", type=_positive(int), default=256, help="self: longest answer (default 256)")
    c.add_argument("--max-batch", type=_positive(int), default=8, help="self: conversations decoded together")
    c.add_argument("--self-writer", choices=("auto", "waves", "scheduler"), default="auto",
                   help="self: waves (each wave's rows decoded as one batch, the states prefilled after it), "
                   "scheduler (the serving scheduler, the states recorded while it writes) or auto (default: "
                   "waves on a GPU, the scheduler on a CPU)")
    c.add_argument("--prefill-tokens", type=_positive(int), default=512,
                   help="padded tokens per batched prefill while collecting (default 512)")
    h = p.add_argument_group("head")
    h.add_argument("--feature", choices=("final", "last_layer"), default=None,
                   help="target state read: its final normed state (eagle, parallel default) or its last layer's "
                   "output before the final norm (mtp default)")
    h.add_argument("--feature-loss", type=_finite, default=None,
                   help="weight of the smooth-L1 loss on the next state (eagle default 1, mtp 0)")
    h.add_argument("--train-depth", type=_positive(int), default=None,
                   help="chained positions unrolled in training (default 2)")
    h.add_argument("--block", type=_positive(int), default=None, help="parallel: longest block drafted (default 8)")
    h.add_argument("--intermediate-size", type=_positive(int), default=None,
                   help="the head layer's MLP width (default: the target's)")
    o = p.add_argument_group("optimization")
    o.add_argument("--draft-vocab", type=_positive(int), default=32768,
                   help="most frequent tokens the head drafts from (default 32768)")
    o.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (default 0: at the budget)")
    o.add_argument("--seq-len", type=_positive(int), default=512, help="tokens per training window (default 512)")
    o.add_argument("--batch", type=_positive(int), default=4, help="windows per step (default 4)")
    o.add_argument("--lr", type=_positive(float), default=1e-3, help="peak learning rate (default 1e-3)")
    o.add_argument("--topk", type=_positive(int), default=8, help="target log-probabilities kept per token (default 8)")
    o.add_argument("--eval-depth", type=_positive(int), default=4, help="positions measured held-out (default 4)")
    o.add_argument("--holdout", type=_finite, default=0.05, help="share of conversations held out (default 0.05)")
    o.add_argument("--save-dtype", default="bf16", help="dtype of the head's matrices on disk (default bf16)")
    o.add_argument("--train-dtype", default="auto", choices=("auto", "fp32", "bf16"),
                   help="the training step's matmuls: auto (default) times both on this machine at the start and "
                   "keeps the faster (bf16 under autocast; parameters and optimizer stay fp32)")
    o.add_argument("--weight-decay", type=_finite, default=0.01, help="AdamW decay on the matrices (default 0.01)")
    o.add_argument("--noise", type=_finite, default=0.05,
                   help="Gaussian noise on the target states read, times their RMS (default 0.05)")
    o.add_argument("--dropout", type=_finite, default=0.1, help="dropout on the head layer's input (default 0.1)")
    o.add_argument("--curve-at", default="50000,200000,500000,1000000",
                   help="tokens seen at which held-out acceptance is measured (default 50k,200k,500k,1M)")
    o.add_argument("--seed", type=int, default=0)
    o.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=run_train)

    e = subparsers.add_parser(
        "export-head",
        help="write a trained head in the speculators layout (vllm serve DIR) for GPU clusters",
        description="Writes config.json and model.safetensors in speculators' MTP layout (MTPDraftModel) for a "
        "chained head that reads the final normed state (eagle, or mtp with --feature final) of a qwen3 target; "
        "it drafts over the verifier's full vocabulary. Other heads are refused with the reason.",
    )
    e.add_argument("head", help="head folder or file written by `augury train`")
    e.add_argument("--format", default="speculators", choices=("speculators",))
    e.add_argument("--out", default=None, help="output folder (default: HEAD/speculators)")
    e.add_argument("--k", type=_positive(int), default=3, help="speculative tokens the config proposes (default 3)")
    e.add_argument("--verifier", default=None,
                   help="the verifier: a Hugging Face id or a local model folder, from which speculators reads the "
                   "embedding and lm_head (default: the target the head was trained for)")
    e.set_defaults(func=run_export)


def _token_counts(text: str) -> tuple[int, ...]:
    try:
        return tuple(sorted({int(part) for part in text.split(",") if part.strip()}))
    except ValueError:
        raise AuguryError(f"--curve-at takes comma-separated token counts, got '{text}'") from None


def run_train(args: argparse.Namespace) -> int:
    from augury.models.head import HeadConfig
    from augury.models.loader import load_model
    from augury.train.collection import CorpusPlan
    from augury.train.corpus import SelfCorpusPlan
    from augury.train.trainer import TrainPlan, train

    # every flag is checked before the target loads
    overrides = {name: getattr(args, name) for name in ("feature", "feature_loss", "train_depth", "block",
                                                        "intermediate_size") if getattr(args, name) is not None}
    config = HeadConfig.for_kind(args.kind, **overrides)
    plan = TrainPlan(seq_len=args.seq_len, batch=args.batch, lr=args.lr, max_steps=args.max_steps,
                     eval_depth=args.eval_depth, topk=args.topk, draft_vocab=args.draft_vocab,
                     holdout=args.holdout, save_dtype=args.save_dtype, train_dtype=args.train_dtype, seed=args.seed,
                     weight_decay=args.weight_decay, noise=args.noise, dropout=args.dropout,
                     curve_at=_token_counts(args.curve_at))
    if args.features_from and (args.resume or args.data):
        raise AuguryError("--features-from trains on another run's states: it takes neither --resume nor --data")
    sources = tuple(s.strip() for s in args.corpus.split(",") if s.strip() and s.strip() != "none")
    corpus = None if args.resume else CorpusPlan(
        sources=sources, data_paths=tuple(args.data), max_tokens=args.corpus_tokens, max_sequences=args.sequences,
        share=args.collect_share, batch_tokens=args.prefill_tokens,
        self_plan=SelfCorpusPlan(request_tokens=args.request_tokens, answer_tokens=args.answer_tokens,
                                 max_batch=args.max_batch, seed=args.seed, writer=args.self_writer))
    target = load_model(args.model, dtype=args.dtype, device=args.device, offline=args.offline,
                        progress=not args.quiet)
    outcome = train(target, config, args.out, hours=args.hours, plan=plan, corpus=corpus, resume=args.resume,
                    features_from=args.features_from, device=args.device, progress=not args.quiet,
                    log=partial(print, flush=True))  # each milestone reaches a redirected log (nohup) as it happens
    print(f"wrote {outcome.path}: {outcome.steps} steps in {outcome.seconds:.0f} s on {outcome.tokens} tokens "
          f"({outcome.sequences} sequences, {outcome.tokens_seen} seen); held-out alpha by position "
          f"{outcome.alpha} (untrained {outcome.alpha_untrained}); rates {outcome.rates}; "
          f"{outcome.disk_bytes / 1e6:.1f} MB on disk")
    return 0


def run_export(args: argparse.Namespace) -> int:
    from pathlib import Path

    from augury.train.export import export_speculators

    head = Path(args.head).expanduser()
    out = Path(args.out).expanduser() if args.out else (head if head.is_dir() else head.parent) / "speculators"
    written = export_speculators(head, out, speculative_tokens=args.k, verifier=args.verifier)
    print(f"wrote {written.config}: speculators' MTP layout, drafting over the verifier's {written.vocab_size} tokens "
          f"(the head was trained on {written.trained_vocab}); serve with: vllm serve {out}")
    return 0
