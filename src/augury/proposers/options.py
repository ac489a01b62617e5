"""Each drafting method's own options: a small dataclass per method, registered with it.

The CLI builds its flags from these dataclasses (one flag per field, grouped by
the methods that read it in `--help`), and `build_proposer` checks that every
option given belongs to the chosen method: an option the method would ignore
is an error naming the method, never silently dropped. This module stays light
(no torch) so the CLI can list every method's options without importing them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from augury.errors import AuguryError
from augury.models.store import DEFAULT_DRAFT

DEFAULT_CROSS_DRAFT = "smollm2-135m-instruct"
# The drafting method when none is named: the suffix matcher where its kind of draft is accepted as
# often as the 0.5B's, the 0.5B otherwise; on Spec-Bench it was faster than the model method on three
# of the four paths and temperatures measured and even on the fourth (docs/benchmarks.md 20a, 21c).
DEFAULT_METHOD = "hybrid"
# A Qwen2.5 0.5B drafting for its 1.5B sibling: a guess below even odds is
# more often rejected than not (docs/benchmarks.md: 1.85x -> 2.00x at 0.5).
MODEL_CONFIDENCE = 0.5
# SmolLM2 through text drafts shorter, surer runs: 0.5 cut tau from 2.28 to 1.70, 0.3 kept 2.06.
CROSS_CONFIDENCE = 0.3
QUANT_FORMATS = ("int4", "int8")
# The drafter's weight formats as --draft-quant names them: auto keeps a GGUF drafter's own blocks (the
# kernel and the C++ layer: a 0.5B Q4_K_M step measured 18.8 ms there against 23.5 ms as torch int4,
# docs/benchmarks.md 7c) and quantizes anything else to int4; q4_0 (fitted scales) is opt-in (35).
# Block types a GGUF drafter's wider blocks may be re-quantized to on load (--draft-quant q4_0).
BLOCK_REQUANTS = ("q4_0",)
DRAFT_QUANTS = ("auto", "gguf", *BLOCK_REQUANTS, *QUANT_FORMATS, "none")
# A trained head's matmul weights while drafting: the target's dtype, or torch's int8 / int4.
HEAD_QUANTS = ("none", *QUANT_FORMATS)
HEAD_DEFAULT_QUANT = "int4"  # measured: same acceptance as bf16, a drafted token 3.0 -> 1.4 ms (docs/benchmarks.md 17)


def opt(default: object, help: str, type: Callable = str) -> object:
    """A method option: its default, its --help line and the type its flag parses to."""
    return field(default=default, metadata={"help": help, "type": type})


@dataclass(frozen=True)
class LoadOptions:
    """How a drafter loads models: set by the target's model flags (--dtype, --device, --offline), not per method."""

    dtype: str = "bf16"
    device: str = "cpu"
    offline: bool = False


LOAD_FIELDS = frozenset(f.name for f in dataclasses.fields(LoadOptions))


def _confidence(default: float) -> object:
    return opt(default, "stop a draft early when the drafter's top probability falls below this (0 = always draft K)",
               float)


# The model drafter's head on the first 32768 ids: as accepted as the whole head, and a cheaper drafted
# token (docs/benchmarks.md 9c).
MODEL_DRAFT_VOCAB = 32768


def _draft_vocab(default: int = 0) -> object:
    return opt(default, "project the drafter onto N token ids only, a cheaper head (0 = full vocabulary); which "
               "ids: --draft-vocab-order", int)


def _draft_vocab_order() -> object:
    return opt("id", "the ids --draft-vocab keeps: id (the first N: BPE ids follow merge order, roughly frequency) "
               "or corpus (the most frequent in the Python standard library's sources and docs, then by id)")


@dataclass(frozen=True)
class ModelOptions(LoadOptions):
    draft: str = opt(DEFAULT_DRAFT, "draft model name or path (same tokenizer as the target)")
    draft_quant: str = opt("auto", "weight format of the drafter: auto (a GGUF's own blocks, else int4), gguf, q4_0 "
                           "(a GGUF's wider blocks re-quantized with fitted scales, a few seconds at load), "
                           "int4 (groups of 32; int8 where torch's int4 kernel does not run), int8, or none "
                           "(the model's own dtype)")
    draft_confidence: float = _confidence(MODEL_CONFIDENCE)
    draft_vocab: int = _draft_vocab(MODEL_DRAFT_VOCAB)
    draft_vocab_order: str = _draft_vocab_order()
    draft_skip_layers: str | None = opt(None, "leave these of the drafter's layers out: a comma list (e.g. 9,11,13) "
                                        "or a file from `augury calibrate`; fewer bytes per drafted token, "
                                        "fewer tokens accepted (none left out by default)")
    draft_context: int = opt(0, "the drafter reads only the last N tokens of a prompt (0 = all of it): a long "
                             "prompt's drafter prefill costs N tokens, not the whole prompt", int)


@dataclass(frozen=True)
class NgramOptions(LoadOptions):
    ngram_min: int = opt(1, "shortest n-gram looked up", int)
    ngram_max: int = opt(4, "longest n-gram looked up", int)


@dataclass(frozen=True)
class SuffixOptions(LoadOptions):
    match_min: int = opt(1, "shortest suffix match worth drafting from", int)
    suffix_corpus: str | None = opt(None, "file persisting earlier outputs as extra corpus between runs")




@dataclass(frozen=True)
class CrossOptions(LoadOptions):
    draft: str = opt(DEFAULT_CROSS_DRAFT, "draft model name or path (any tokenizer)")
    draft_quant: str = opt("int4", "weight format of the drafter: int4, int8 or none")
    draft_confidence: float = _confidence(CROSS_CONFIDENCE)


@dataclass(frozen=True)
class LayerSkipOptions(LoadOptions):
    skip_layers: str | None = opt(None, "comma list of layers to skip, or a file from `augury calibrate`")
    draft_confidence: float = _confidence(0.0)
    draft_vocab: int = _draft_vocab()
    draft_vocab_order: str = _draft_vocab_order()


@dataclass(frozen=True)
class QuantizedOptions(LoadOptions):
    draft_quant: str = opt("int4", "weight format of the self-draft copy: int4 (int8 where torch's int4 kernel "
                           "does not run) or int8")
    draft_confidence: float = _confidence(0.0)
    draft_vocab: int = _draft_vocab()
    draft_vocab_order: str = _draft_vocab_order()


@dataclass(frozen=True)
class HeadOptions(LoadOptions):
    head: str | None = opt(None, "a head trained for this target by `augury train` (its folder or head.safetensors)")
    draft_vocab: int = opt(0, "keep only the head's N most frequent tokens (0 = the vocabulary it was trained with)",
                           int)
    draft_quant: str = opt("auto", f"weight format of the head's matrices while drafting: auto ({HEAD_DEFAULT_QUANT}), "
                           "none (the target's dtype), int8, or int4 (int8 where torch's int4 kernel does not run)")


@dataclass(frozen=True)
class HybridOptions(ModelOptions, SuffixOptions):
    """The suffix matcher's options and the fallback's: a draft model, or a trained head (--head)."""

    head: str | None = opt(None, "a head trained for this target by `augury train` (its folder or head.safetensors)")


def method_fields(options_cls: type) -> dict[str, dataclasses.Field]:
    """A method's own option fields (the load options excluded)."""
    return {f.name: f for f in dataclasses.fields(options_cls) if f.name not in LOAD_FIELDS}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def make_options(method: str, options_cls: type, given: dict[str, object]):
    """The method's options from the values given; an option it does not read is an error naming it."""
    own = method_fields(options_cls)
    unused = [name for name in given if name not in own and name not in LOAD_FIELDS]
    if unused:
        names = ", ".join(flag(n) for n in unused)
        takes = ", ".join(flag(n) for n in own) or "no options"
        raise AuguryError(f"{names} is not an option of draft method '{method}' (it takes {takes})")
    return options_cls(**given)


def split_options(given: dict[str, object], methods: dict[str, type]) -> dict[str, dict[str, object]]:
    """Options given once for several methods (a benchmark run): each method gets those it reads.

    methods: name -> options dataclass. An option no method reads is an error naming the methods.
    """
    out = {name: {k: v for k, v in given.items() if k in LOAD_FIELDS or k in method_fields(cls)}
           for name, cls in methods.items()}
    unread = [k for k in given if k not in LOAD_FIELDS and not any(k in o for o in out.values())]
    if unread:
        names = ", ".join(flag(n) for n in unread)
        raise AuguryError(f"{names} is not an option of any of the methods given ({', '.join(methods) or 'none'})")
    return out
