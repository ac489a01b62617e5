"""Drafters, all behind the `Proposer` protocol, built by method name.

Each method registers one builder taking the target model and `DraftOptions`;
the CLI, the benchmark and the server all build proposers through
`build_proposer`, so adding a drafter means adding one builder here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from augury.errors import AuguryError
from augury.models.loader import Model
from augury.proposers.base import Draft, Proposer, Sequence, ProposerBase

__all__ = ["Draft", "DraftOptions", "Proposer", "Sequence", "ProposerBase", "build_proposer", "METHODS"]


@dataclass
class DraftOptions:
    """Everything any drafter may be configured with (each reads what it needs)."""

    draft: str | None = None  # draft model name or path (model, cross, hybrid)
    dtype: str = "bf16"
    device: str = "cpu"
    offline: bool = False
    ngram_min: int = 1  # ngram/suffix/hybrid: shortest match worth proposing
    ngram_max: int = 4  # ngram: longest suffix looked up
    suffix_corpus: str | None = None  # suffix: file that persists earlier outputs between runs
    skip_layers: str | None = None  # layerskip: "3,5,7" or a calibration file written by `augury calibrate`
    quant: str = "int4"  # quantized: weight format of the self-draft copy (int8 where int4 does not run)
    # model drafters: stop drafting below this top probability (0 = never;
    # None = the drafter's own default, as calibrated models differ)
    draft_confidence: float | None = None
    draft_vocab: int = 0  # model drafters: project onto the first N token ids only (0 = full vocabulary)
    draft_quant: str = "int4"  # model and cross drafters: weight format of the draft model ("int4", "int8" or "none")

    def confidence_or(self, default: float) -> float:
        """The confidence threshold asked for, else the drafter's own default."""
        return default if self.draft_confidence is None else self.draft_confidence


def quantize_draft(draft: Model, fmt: str) -> Model:
    """The draft model with its matmul weights in `fmt` ("int4", "int8"; "none" keeps them).

    A drafter's guesses are checked by the target, so its weights may be
    lossy: on a CPU reading fewer weight bytes is what makes drafting cheap.
    """
    if fmt == "none":
        return draft
    if fmt not in ("int8", "int4"):
        raise AuguryError(f"unknown --draft-quant '{fmt}' (choose from int8, int4, none)")
    from augury.proposers.quantized import int4_matmul_available, quantize_decoder

    if fmt == "int4" and not int4_matmul_available(draft.decoder):
        fmt = "int8"  # torch's int4 kernel is CPU-only
    return Model(name=draft.name, decoder=quantize_decoder(draft.decoder, fmt=fmt),
                 tokenizer=draft.tokenizer, source=draft.source)


def _build_model(target: Model, options: DraftOptions) -> Proposer:
    from augury.models.loader import load_model
    from augury.proposers.draft_model import DEFAULT_CONFIDENCE, DraftModelProposer, check_same_vocabulary

    if not options.draft:
        raise AuguryError("--draft-method model needs --draft NAME_OR_PATH")
    draft = load_model(options.draft, dtype=options.dtype, device=options.device, offline=options.offline)
    check_same_vocabulary(target, draft)
    draft = quantize_draft(draft, options.draft_quant)
    return DraftModelProposer(
        draft, target.config.vocab_size, vocab_limit=options.draft_vocab,
        confidence=options.confidence_or(DEFAULT_CONFIDENCE),
    )


def _lazy(module: str, function: str = "build") -> Callable[[Model, DraftOptions], Proposer]:
    """A builder imported on first use, so that one method's dependencies never slow the others."""

    def builder(target: Model, options: DraftOptions) -> Proposer:
        import importlib

        return getattr(importlib.import_module(f"augury.proposers.{module}"), function)(target, options)

    return builder


# method name -> builder(target, options). "plain" means no proposer at all.
METHODS: dict[str, Callable[[Model, DraftOptions], Proposer]] = {
    "model": _build_model,
    "ngram": _lazy("ngram"),
    "suffix": _lazy("suffix"),
    "cross": _lazy("cross_tokenizer"),
    "layerskip": _lazy("layer_skip"),
    "quantized": _lazy("quantized"),
    "hybrid": _lazy("hybrid"),
}


def build_proposer(method: str, target: Model, options: DraftOptions) -> Proposer | None:
    """The proposer for a method name; None for plain decoding."""
    if method == "plain":
        return None
    builder = METHODS.get(method)
    if builder is None:
        raise AuguryError(f"unknown draft method '{method}' (choose from plain, {', '.join(sorted(METHODS))})")
    return builder(target, options)
