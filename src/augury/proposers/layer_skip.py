"""Layer-skip self-speculation: the target with some of its layers skipped drafts for itself.

The drafter is the target's own tensors without the skipped layers
(`skipped_layers.layer_skip_model`), with its own KV cache. It shares the
tokenizer exactly, so drafting is the same autoregressive loop as a separate
draft model's, and `DraftModelProposer` runs it unchanged. Which layers: see
`skipped_layers.parse_skip_layers` (a list, a calibration file, or the saved
calibration or default for this model).
"""

from __future__ import annotations

from augury.models.loader import Model
from augury.proposers.draft_model import DraftModelProposer
from augury.proposers.skipped_layers import layer_skip_model, parse_skip_layers


class LayerSkipProposer(DraftModelProposer):
    """Self-speculation through a layer-skipped view of the target."""

    name = "layerskip"


def build(target: Model, options) -> LayerSkipProposer:
    """The layerskip proposer for `target`, skipping options.skip_layers (see parse_skip_layers)."""
    from augury.proposers.draft_vocab import head_vocab

    skip = parse_skip_layers(options.skip_layers, target.config.num_layers, target.name)
    draft = layer_skip_model(target, skip)
    return LayerSkipProposer(draft, target.config.vocab_size, confidence=options.draft_confidence,
                             vocab_limit=head_vocab(draft, options.draft_vocab, options.draft_vocab_order))
