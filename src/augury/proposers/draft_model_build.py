"""Building the draft model proposer: load the drafter, check it speaks the target's token ids, convert it.

The registry's builder for method "model" (and the hybrid's model part). Kept
apart from `draft_model.py`, which drafts: this file decides what model drafts
(its tokenizer checked against the target's, its head cut and its weights
converted before any drafting), that one how it drafts.
"""

from __future__ import annotations

import dataclasses

from augury.errors import AuguryError
from augury.models.loader import Model
from augury.proposers.draft_model import DraftModelProposer, head_restricted


def check_same_vocabulary(target: Model, draft: Model) -> None:
    """Refuse a draft model whose token ids could mean something else to the target.

    The drafter can emit any id its output head has a row for, and it reads
    every token the target commits (any its head has a row for); so each such
    id must be the same token in both tokenizers. Ids neither tokenizer names
    (the unused rows Qwen checkpoints pad their heads with, which differ
    between sizes) and names past both heads are no obstacle.
    """
    t_tokens = {i: tok for tok, i in target.tokenizer.vocab.items()}
    # one backend shared (`load_model`'s share_tokenizer: the same tokenizer.json) names every id alike
    backend = getattr(target.tokenizer, "backend", None)
    shared = backend is not None and backend is getattr(draft.tokenizer, "backend", None)
    d_tokens = t_tokens if shared else {i: tok for tok, i in draft.tokenizer.vocab.items()}
    emits = draft.config.vocab_size
    ids = {i for i in d_tokens if i < emits} | {i for i in t_tokens if i < target.config.vocab_size}
    bad = next((i for i in sorted(ids) if i >= emits or t_tokens.get(i) != d_tokens.get(i)), None)
    if bad is not None:
        def name(tokens: dict[int, str]) -> str:
            return repr(tokens[bad]) if bad in tokens else "no token"

        theirs = "past its vocabulary" if bad >= emits else name(d_tokens)
        raise AuguryError(
            f"draft model {draft.name} has a different tokenizer than target {target.name} "
            f"(id {bad}: {name(t_tokens)} for the target, {theirs} for the drafter); "
            "use --draft-method cross for drafts from a model with another tokenizer"
        )


def converted_drafter(draft: Model, options) -> Model:
    """The drafter with its head cut to options.draft_vocab (`draft_vocab.head_vocab`), then its weights in
    options.draft_quant (`quantize_draft`). Cut first, so that only the kept rows are converted: a third
    of the 0.5B's head-and-layers is its head, most of it rows never drafted (docs/benchmarks.md 35a)."""
    from augury.proposers import quantize_draft
    from augury.proposers.draft_vocab import head_vocab

    vocab = head_vocab(draft, options.draft_vocab, options.draft_vocab_order)
    return quantize_draft(dataclasses.replace(draft, decoder=head_restricted(draft.decoder, vocab)),
                          options.draft_quant)


def build(target: Model, options) -> DraftModelProposer:
    """The registry's builder: load options.draft (same tokenizer), quantize it, draft with confidence and head limits."""
    from augury.models.loader import load_model

    if not options.draft:
        raise AuguryError("draft method 'model' needs --draft NAME_OR_PATH")
    draft = load_model(options.draft, dtype=options.dtype, device=options.device, offline=options.offline,
                       share_tokenizer=target.tokenizer)
    check_same_vocabulary(target, draft)
    if options.draft_skip_layers is not None:
        from augury.proposers.skipped_layers import layer_skip_model, parse_skip_layers

        draft = layer_skip_model(draft, parse_skip_layers(options.draft_skip_layers, draft.config.num_layers,
                                                          draft.name, flag="--draft-skip-layers"))
    return DraftModelProposer(converted_drafter(draft, options), target.config.vocab_size,
                              confidence=options.draft_confidence, context=options.draft_context)
