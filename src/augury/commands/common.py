"""Arguments shared by generate, bench and serve: model, drafter, sampling."""

from __future__ import annotations

import argparse

from augury.models.store import DEFAULT_DRAFT, DEFAULT_TARGET
from augury.sampling import SamplingParams


def add_model_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--model", "-m", default=DEFAULT_TARGET, help=f"target model name or path (default {DEFAULT_TARGET})")
    g.add_argument("--dtype", default="bf16", help="bf16 (default, fast on CPUs with AMX/AVX-512), fp16 or fp32")
    g.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]")
    g.add_argument("--offline", action="store_true", help="never download: use only models already pulled")
    g.add_argument(
        "--no-exact",
        dest="exact",
        action="store_false",
        help="skip the batch-invariant padding (bf16 speculative output may then differ from plain at near-ties)",
    )


def add_draft_args(parser: argparse.ArgumentParser, *, default_method: str = "model") -> None:
    from augury.proposers import METHODS

    g = parser.add_argument_group("drafting")
    g.add_argument(
        "--draft-method",
        default=default_method,
        help=f"plain (no speculation) or one of: {', '.join(sorted(METHODS))} (default {default_method})",
    )
    from augury.proposers.cross_tokenizer import DEFAULT_CROSS_DRAFT

    g.add_argument(
        "--draft",
        default=None,
        help=f"draft model name or path (model, hybrid: default {DEFAULT_DRAFT}; cross: default {DEFAULT_CROSS_DRAFT})",
    )
    g.add_argument("--k", type=int, default=4, help="draft length K: tokens proposed per step (default 4)")
    g.add_argument("--ngram-min", type=int, default=1, help="ngram/suffix: shortest match to use (default 1)")
    g.add_argument("--ngram-max", type=int, default=4, help="ngram: longest suffix to look up (default 4)")
    g.add_argument("--suffix-corpus", default=None, help="suffix: file persisting earlier outputs as extra corpus")
    g.add_argument(
        "--skip-layers", default=None, help="layerskip: comma list of layers to skip, or a file from `augury calibrate`"
    )
    g.add_argument(
        "--draft-confidence",
        type=float,
        default=None,
        help="model drafters: stop a draft early when the drafter's top probability falls below this "
        "(default 0.5 for model and hybrid, 0.3 for cross; 0 = always draft K)",
    )
    g.add_argument(
        "--draft-vocab",
        type=int,
        default=0,
        help="model drafters: project onto the first N token ids only, a cheaper head (0 = full vocabulary)",
    )
    g.add_argument(
        "--draft-quant",
        default="int4",
        help="model and cross drafters: int4 (default: 4-bit groups of 32; int8 where torch's int4 kernel does not run, "
        "e.g. on GPUs), int8 (weight-only int8) or none (the draft model's own dtype)",
    )
    g.add_argument("--quant", default="int4",
                   help="quantized: weight format of the self-draft copy, int4 (default; int8 where torch's int4 "
                   "kernel does not run) or int8")


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("sampling")
    g.add_argument("--temperature", "-t", type=float, default=0.0, help="0 = greedy (default)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass in (0, 1]")
    g.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p * max probability")
    g.add_argument("--repetition-penalty", type=float, default=1.0)
    g.add_argument("--presence-penalty", type=float, default=0.0)
    g.add_argument("--frequency-penalty", type=float, default=0.0)
    g.add_argument("--seed", type=int, default=None, help="seed for reproducible sampling")
    g.add_argument("--max-tokens", "-n", type=int, default=256, help="tokens to generate at most (default 256)")
    g.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    g.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence tokens")


def sampling_from_args(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        presence_penalty=args.presence_penalty,
        frequency_penalty=args.frequency_penalty,
        max_tokens=args.max_tokens,
        stop=tuple(args.stop),
        seed=args.seed,
        ignore_eos=args.ignore_eos,
    )


def draft_options_from_args(args: argparse.Namespace):
    from augury.proposers import DraftOptions

    draft = args.draft
    if draft is None and args.draft_method in ("model", "hybrid"):  # cross picks its own default
        draft = DEFAULT_DRAFT
    return DraftOptions(
        draft=draft,
        dtype=args.dtype,
        device=args.device,
        offline=args.offline,
        ngram_min=args.ngram_min,
        ngram_max=args.ngram_max,
        suffix_corpus=args.suffix_corpus,
        skip_layers=args.skip_layers,
        quant=args.quant,
        draft_confidence=args.draft_confidence,
        draft_vocab=args.draft_vocab,
        draft_quant=args.draft_quant,
    )
