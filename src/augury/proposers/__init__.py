"""Drafters, all behind the `Proposer` protocol, built by method name.

Each method registers one builder and its options dataclass
(`proposers/options.py`); the CLI, the benchmark, the server and the Python
API all build proposers through `build_proposer`, so adding a drafter means
adding one `Method` here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from augury.errors import AuguryError
from augury.models.loader import Model
from augury.proposers import options as opts
from augury.proposers.base import Draft, Proposer, ProposerBase, Sequence

__all__ = ["Draft", "METHODS", "Method", "Proposer", "ProposerBase", "Sequence", "build_proposer", "method_names"]


@dataclass(frozen=True)
class Method:
    """A drafting method: what it is, its options, and where its builder lives (imported on first use,
    so that one method's dependencies never slow the others)."""

    summary: str
    options: type
    module: str
    function: str = "build"

    def build(self, target: Model, options) -> Proposer:
        builder: Callable = getattr(importlib.import_module(f"augury.proposers.{self.module}"), self.function)
        return builder(target, options)


METHODS: dict[str, Method] = {
    "model": Method("a smaller model with the target's tokenizer", opts.ModelOptions, "draft_model_build"),
    "ngram": Method("prompt lookup: the latest earlier occurrence of the last n tokens", opts.NgramOptions, "ngram"),
    "suffix": Method("suffix automaton over prompt, output and earlier outputs", opts.SuffixOptions, "suffix"),
    "hybrid": Method("the suffix matcher, else the draft model", opts.HybridOptions, "hybrid"),
    "cross": Method("a model with another tokenizer, through text", opts.CrossOptions, "cross_tokenizer"),
    "layerskip": Method("the target with some layers skipped", opts.LayerSkipOptions, "layer_skip"),
    "quantized": Method("a low-bit copy of the target", opts.QuantizedOptions, "quantized"),
    "mtp": Method("a trained MTP head on the target's states (--head)", opts.HeadOptions, "heads", "build_mtp"),
    "eagle": Method("a trained EAGLE head on the target's states (--head)", opts.HeadOptions, "heads", "build_eagle"),
    "parallel": Method("a trained block head: K tokens in one forward (--head)", opts.HeadOptions, "heads",
                       "build_parallel"),
}


def method_names() -> list[str]:
    """Every method name a user may give, plain (no speculation) first."""
    return ["plain", *sorted(METHODS)]


def check_method(method: str) -> str:
    if method != "plain" and method not in METHODS:
        raise AuguryError(f"unknown draft method '{method}' (choose from {', '.join(method_names())})")
    return method


def check_options(method: str, options: Mapping[str, object]) -> None:
    """Refuse a method name or an option the method does not read, before anything is loaded."""
    if check_method(method) == "plain":
        extra = [k for k in options if k not in opts.LOAD_FIELDS]
        if extra:
            raise AuguryError(f"{', '.join(opts.flag(k) for k in extra)} is not an option of plain decoding")
        return
    opts.make_options(method, METHODS[method].options, dict(options))


def build_proposer(
    method: str, target: Model, options: Mapping[str, object] | None = None, /, **kwargs: object
) -> Proposer | None:
    """The proposer for a method name (None for plain decoding).

    options / kwargs: the method's options by field name (see its dataclass in
    proposers/options.py) plus dtype, device and offline for loading drafters;
    an option the method does not take is an AuguryError naming the method.
    """
    given = {**(options or {}), **kwargs}
    check_options(method, given)
    if method == "plain":
        return None
    spec = METHODS[method]
    return spec.build(target, opts.make_options(method, spec.options, given))


def quantize_draft(draft: Model, fmt: str) -> Model:
    """The draft model with its matmul weights in `fmt` ("int4", "int8"; "none" keeps them; "gguf" keeps a
    GGUF drafter's own blocks; "q4_0" re-quantizes its wider blocks to Q4_0, each block's scale fitted;
    "auto": "gguf" where the drafter runs on GGUF blocks, else "int4").

    A drafter's guesses are checked by the target, so its weights may be
    lossy: on a CPU reading fewer weight bytes is what makes drafting cheap.
    The 0.5B's Q5_0/Q6_K/Q8_0 blocks as fitted Q4_0 cost about a point of
    first-token acceptance for 7-20% less time a drafter forward, which
    did not show in the hybrid's speed (docs/benchmarks.md 35): opt-in.
    """
    if fmt not in opts.DRAFT_QUANTS:
        raise AuguryError(f"unknown --draft-quant '{fmt}' (choose from {', '.join(opts.DRAFT_QUANTS)})")
    on_blocks = draft.decoder.native is not None
    if fmt == "auto":
        fmt = "gguf" if on_blocks else "int4"
    if fmt == "gguf" and not on_blocks:
        raise AuguryError(f"--draft-quant gguf needs a GGUF drafter on the native kernel; {draft.name} is not one")
    if fmt in ("none", "gguf"):
        return draft
    if fmt in opts.BLOCK_REQUANTS:
        if not on_blocks:
            raise AuguryError(f"--draft-quant {fmt} re-quantizes a GGUF drafter's blocks on the native kernel; "
                              f"{draft.name} is not one")
        from augury.models.low_bit import requantize_decoder

        return Model(name=draft.name, decoder=requantize_decoder(draft.decoder, fmt.upper()),
                     tokenizer=draft.tokenizer, source=draft.source)
    from augury.models.low_bit import int4_matmul_available, quantize_decoder

    if fmt == "int4" and not int4_matmul_available(draft.decoder.dtype, draft.decoder.device):
        fmt = "int8"  # torch's int4 kernel is CPU-only
    return Model(name=draft.name, decoder=quantize_decoder(draft.decoder, fmt=fmt),
                 tokenizer=draft.tokenizer, source=draft.source)
