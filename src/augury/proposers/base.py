"""The one interface every drafter implements.

A proposer sees a sequence (prompt plus committed tokens), proposes up to k
next tokens, and hears back how many the target accepted so it can roll back
whatever state it keeps (a KV cache, a match pointer) and adapt.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from augury.sampling import SamplingParams

_ids = itertools.count()


@dataclass
class Sequence:
    """One request's tokens as the engine and the proposers see them.

    tokens holds the prompt followed by every committed token; the proposers
    read it, only the engine appends to it.
    """

    tokens: list[int]
    params: SamplingParams
    prompt_len: int = -1
    generator: torch.Generator | None = None
    id: int = field(default_factory=lambda: next(_ids))

    def __post_init__(self) -> None:
        if self.prompt_len < 0:
            self.prompt_len = len(self.tokens)

    @property
    def prompt(self) -> list[int]:
        return self.tokens[: self.prompt_len]

    @property
    def output(self) -> list[int]:
        return self.tokens[self.prompt_len :]


@dataclass(frozen=True)
class Draft:
    """Proposed next tokens for one sequence.

    tokens: up to k token ids (may be empty: nothing worth proposing).
    q_draft: [len(tokens), V] probabilities they were sampled from, or None
        for a deterministic proposal (verified as a point mass, still lossless).
    """

    tokens: list[int]
    q_draft: Tensor | None = None

    def __len__(self) -> int:
        return len(self.tokens)


@runtime_checkable
class Proposer(Protocol):
    """A drafter. Implementations keep per-sequence state keyed by Sequence.id."""

    name: str

    def start(self, seq: Sequence) -> None:
        """A new sequence begins (its prompt is in seq.tokens): set up state, prefill."""

    def propose(self, seq: Sequence, k: int) -> Draft:
        """Up to k next tokens after seq.tokens."""

    def on_verified(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        """The target kept num_accepted drafted tokens; seq.tokens now holds them plus one more."""

    def finish(self, seq: Sequence) -> None:
        """The sequence ended: free its state."""

    @property
    def forwards(self) -> int:
        """Model forward passes run so far (0 for model-free drafters)."""

    # Optional: `propose_batch(seqs, ks) -> list[Draft]` drafts for several
    # sequences at once (one drafter forward per drafted position for all of
    # them). Callers go through `propose_batch` below, which falls back to
    # one `propose` per sequence for drafters without it.


def propose_batch(proposer: Proposer, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
    """Drafts for several sequences: batched where the proposer can, one by one otherwise."""
    batched = getattr(proposer, "propose_batch", None)
    if batched is not None:
        return batched(seqs, ks)
    return [proposer.propose(seq, k) if k > 0 else Draft([]) for seq, k in zip(seqs, ks)]


def batches(proposer: Proposer) -> bool:
    """Whether the proposer drafts several sequences in one forward (changes what drafting costs)."""
    return hasattr(proposer, "propose_batch")


class StatelessProposer:
    """Base for drafters that need no per-sequence cleanup (matchers over seq.tokens)."""

    name = "stateless"
    forwards = 0

    def start(self, seq: Sequence) -> None:
        pass

    def on_verified(self, seq: Sequence, num_drafted: int, num_accepted: int) -> None:
        pass

    def finish(self, seq: Sequence) -> None:
        pass
