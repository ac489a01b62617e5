"""Quantized self-drafting: a 4-bit (default on CPU) or int8 copy of the target drafts for the target.

The copy's weights are `models/low_bit.py`'s (the model drafter uses them too).
Verification by the full-precision target keeps the output lossless whatever
the quantization error: greedy output equals plain greedy output, and sampled
drafts carry q_draft through rejection sampling. Measured speeds are in
docs/benchmarks.md (the int4 self-draft: 1.63x over plain against int8's 1.19x
on six Spec-Bench prompts).
"""

from __future__ import annotations

import dataclasses

from augury.errors import AuguryError
from augury.models.loader import Model
from augury.proposers.draft_model import DraftModelProposer
from augury.proposers.options import QUANT_FORMATS


class QuantizedProposer(DraftModelProposer):
    """Self-speculation through a low-precision copy of the target."""

    name = "quantized"


def build(target: Model, options) -> QuantizedProposer:
    """The quantized self-draft proposer; options.draft_quant picks the weight format (QuantizedOptions)."""
    if options.draft_quant not in QUANT_FORMATS:
        raise AuguryError(f"unknown --draft-quant '{options.draft_quant}' for the quantized self-draft "
                          f"(choose from {', '.join(QUANT_FORMATS)})")
    from augury.proposers.draft_model_build import converted_drafter

    # int4 falls back to int8 where its kernel does not run
    draft = converted_drafter(dataclasses.replace(target, name=f"{target.name}:{options.draft_quant}"), options)
    return QuantizedProposer(draft, target.config.vocab_size, confidence=options.draft_confidence)
