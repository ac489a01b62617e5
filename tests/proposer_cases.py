"""Every drafter, built on tiny models, for the tests that must hold for all of them.

Losslessness and greedy equivalence are parametrized over PROPOSER_CASES, so
a new drafter gets the whole battery by adding one line here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from augury.models.loader import Model
from augury.proposers import Proposer
from tests.tiny import tiny_model


@dataclass(frozen=True)
class ProposerCase:
    name: str
    build: Callable[[Model, int], Proposer]  # (target, seed) -> proposer


def _draft_model(target: Model, seed: int) -> Proposer:
    from augury.proposers.draft_model import DraftModelProposer

    cfg = target.config
    draft = tiny_model(vocab=cfg.vocab_size, seed=seed, hidden=cfg.hidden_size, dtype=target.decoder.dtype)
    return DraftModelProposer(draft, cfg.vocab_size)


def _draft_model_lean(target: Model, seed: int) -> Proposer:
    """The draft model with early stopping on low confidence and a truncated output head."""
    from augury.proposers.draft_model import DraftModelProposer

    cfg = target.config
    draft = tiny_model(vocab=cfg.vocab_size, seed=seed, hidden=cfg.hidden_size, dtype=target.decoder.dtype)
    return DraftModelProposer(draft, cfg.vocab_size, confidence=0.5, vocab_limit=cfg.vocab_size - 1)


def _draft_model_subset(target: Model, seed: int) -> Proposer:
    """The draft model projecting onto two thirds of the ids only (a frequency-ranked head's shape)."""
    from augury.proposers.draft_model import DraftModelProposer

    cfg = target.config
    draft = tiny_model(vocab=cfg.vocab_size, seed=seed, hidden=cfg.hidden_size, dtype=target.decoder.dtype)
    return DraftModelProposer(draft, cfg.vocab_size, vocab_limit=subset_ids(cfg.vocab_size))


def _draft_model_context(target: Model, seed: int) -> Proposer:
    """The draft model reading only the last 4 tokens of a sequence at its start (most test prompts are longer)."""
    from augury.proposers.draft_model import DraftModelProposer

    cfg = target.config
    draft = tiny_model(vocab=cfg.vocab_size, seed=seed, hidden=cfg.hidden_size, dtype=target.decoder.dtype)
    return DraftModelProposer(draft, cfg.vocab_size, context=4)


def subset_ids(vocab: int):
    """The ids the subset drafter keeps: every id but those = 1 (mod 3)."""
    import torch

    return torch.tensor([i for i in range(vocab) if i % 3 != 1])


def _cross(target: Model, seed: int) -> Proposer:
    """A drafter whose tokenizer numbers the same characters differently (ids reversed)."""
    from augury.proposers.cross_tokenizer import CrossTokenizerProposer
    from tests.tiny import CharTokenizer

    cfg = target.config
    draft = tiny_model(vocab=cfg.vocab_size, seed=seed, hidden=cfg.hidden_size, dtype=target.decoder.dtype)
    tokenizer = CharTokenizer(cfg.vocab_size)
    tokenizer.ALPHABET = tokenizer.ALPHABET[: cfg.vocab_size][::-1]
    tokenizer.vocab = {c: i for i, c in enumerate(tokenizer.ALPHABET)}
    draft.tokenizer = tokenizer
    return CrossTokenizerProposer(draft, target, confidence=0.1)


def _registered(method: str, **options) -> Callable[[Model, int], Proposer]:
    """A method built through the registry, as the CLI builds it."""

    def build(target: Model, seed: int) -> Proposer:
        from augury.proposers import build_proposer

        return build_proposer(method, target, **options)

    return build


def _hybrid(target: Model, seed: int) -> Proposer:
    from augury.proposers.hybrid import HybridProposer
    from augury.proposers.suffix import SuffixProposer

    return HybridProposer(SuffixProposer(ngram_min=2), _draft_model(target, seed), min_match_tokens=2)


PROPOSER_CASES: list[ProposerCase] = [
    ProposerCase("model", _draft_model),
    ProposerCase("model-lean", _draft_model_lean),
    ProposerCase("model-subset", _draft_model_subset),
    ProposerCase("model-context", _draft_model_context),
    ProposerCase("ngram", _registered("ngram", ngram_min=1, ngram_max=3)),
    ProposerCase("suffix", _registered("suffix", match_min=1)),
    ProposerCase("hybrid", _hybrid),
    ProposerCase("cross", _cross),
    ProposerCase("layerskip", _registered("layerskip", skip_layers="1")),
    ProposerCase("quantized", _registered("quantized")),
    ProposerCase("quantized-int8", _registered("quantized", draft_quant="int8")),
]


def make_proposer(case: ProposerCase, target: Model, seed: int = 1) -> Proposer:
    return case.build(target, seed)
