"""The one interface every drafter implements.

A proposer sees a sequence (prompt plus committed tokens), proposes up to k
next tokens, and hears back after every target step what was committed (and,
if it asks, the target's hidden states there) so it can roll back whatever
state it keeps (a KV cache, a match pointer) and adapt.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from augury.sampling import SamplingParams
from augury.verify import VerifyResult

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
    bucket: what kind of draft this is, for a proposer that can tell drafts
        likely to be accepted from unlikely ones (a matcher: the octave of its
        match length, `match_bucket`); 0 when it cannot. The planner measures
        acceptance per bucket and verifies only as much of a draft as its
        bucket's acceptance pays for (`Planner.trim`).
    """

    tokens: list[int]
    q_draft: Tensor | None = None
    bucket: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def truncated(self, k: int) -> "Draft":
        """The first k drafted tokens (and their q_draft rows), of the same bucket."""
        if k >= len(self.tokens):
            return self
        q_draft = self.q_draft[:k] if self.q_draft is not None else None
        return Draft(self.tokens[:k], q_draft, self.bucket)


MATCH_BUCKETS = 5  # match lengths 1, 2-3, 4-7, 8-15 and 16 or more


def match_bucket(length: int) -> int:
    """A matcher's draft bucket: the octave of its match length (1, 2-3, 4-7, 8-15, 16+ -> 1..5).

    The longer the context a matcher found again, the likelier its
    continuation is right (on Spec-Bench, greedy, 1.5B: first-token acceptance
    rose from about 0.2 at one matched token to about 0.8 past eight; dated in
    docs/benchmarks.md), so drafts are told apart by octave of the length.
    """
    return min(max(length, 1), 1 << (MATCH_BUCKETS - 1)).bit_length()


@runtime_checkable
class Proposer(Protocol):
    """A drafter. Implementations keep per-sequence state keyed by Sequence.id.

    What a proposer needs from the drivers it declares, so that no driver can
    skip it by accident:
    - needs_hidden: it reads the target's hidden states; it is then started
      right after the target's prefill with the prompt's states, and after every
      step it receives the states of the newly cached positions.
    - hidden_layers: decoder layers whose outputs it wants next to the final
      normed state (concatenated on the last axis, see `Decoder.forward`).
    - needs_every_step: it must hear every step from the prompt on (drafted or
      not), so it is started with the prompt and never left out. A proposer
      without it is started lazily, on the first step that drafts for the
      sequence, and must catch up by itself on what it missed.
    - drafts_free: its drafts cost no model forward (a matcher), so a planner
      lets it draft all it may every step and then verifies what pays.
    """

    name: str
    needs_hidden: bool
    needs_every_step: bool
    drafts_free: bool
    hidden_layers: tuple[int, ...]

    def start(self, seq: Sequence, prompt_hidden: Tensor | None = None) -> None:
        """A new sequence begins (seq.tokens holds what the target has committed so far).

        prompt_hidden: [len(seq.tokens) - 1, H'] the target's states of the
        cached tokens (every token but the last committed one), or None.
        """

    def propose(self, seq: Sequence, k: int) -> Draft:
        """Up to k next tokens after seq.tokens."""

    def on_step(self, seq: Sequence, result: VerifyResult, hidden: Tensor | None) -> None:
        """A target step committed result.tokens (seq.tokens now ends with them), drafted or not.

        Roll back whatever the proposer drafted past what was accepted. hidden:
        [n, H'] the target's states of the n positions this step added to its
        cache (the token before the draft, then the accepted ones), for
        proposers with needs_hidden, else None.
        """

    def finish(self, seq: Sequence) -> None:
        """The sequence ended: free its state."""

    @property
    def forwards(self) -> int:
        """Model forward passes run so far (0 for model-free drafters)."""

    # Optional: `propose_batch(seqs, ks) -> list[Draft]` drafts for several
    # sequences at once (one drafter forward per drafted position for all of
    # them), and `start_batch(seqs)` starts several lazily started sequences
    # at once (one drafter prefill for all). Callers go through `propose_batch`
    # and `start_batch` below, which fall back to one call per sequence.
    # `propose_free(seq, k) -> Draft` drafts with only the part of a proposer
    # that runs no model (a hybrid's matcher), on steps the planner gave no
    # draft; it must work on a sequence the proposer was never started for. Such
    # a proposer's `propose_batch(seqs, ks, free_ks)` also takes how long each
    # of its free drafts may run on a step it drafts anyway.
    # `prefill_batch(seqs, counts) -> list[int]` feeds a lazily started drafter
    # a piece of what it has not seen, drafting nothing (the batching
    # scheduler starts a drafter on a long prompt a piece per step with it).


def propose_batch(proposer: Proposer, seqs: list[Sequence], ks: list[int],
                  free_ks: list[int] | None = None) -> list[Draft]:
    """Drafts for several sequences: batched where the proposer can, one by one otherwise.

    free_ks: how long each draft may run where the proposer drafts it at no cost
    (a proposer with `propose_free`, whose `propose_batch` takes them); ignored
    by proposers without a free part."""
    batched = getattr(proposer, "propose_batch", None)
    if batched is not None and free_ks is not None and hasattr(proposer, "propose_free"):
        return batched(seqs, ks, free_ks)
    if batched is not None:
        return batched(seqs, ks)
    return [proposer.propose(seq, k) if k > 0 else Draft([]) for seq, k in zip(seqs, ks)]


def start_batch(proposer: Proposer, seqs: list[Sequence]) -> None:
    """Start several sequences without target states: together where the proposer can, one by one otherwise."""
    batched = getattr(proposer, "start_batch", None)
    if batched is not None:
        batched(seqs)
        return
    for seq in seqs:
        proposer.start(seq, None)


def start_offset(proposer: Proposer, length: int) -> int:
    """How many of a sequence's first tokens the proposer skips when it starts on `length` of them (a draft
    model reading only the last N tokens of a long prompt); its start feeds the rest."""
    offset = getattr(proposer, "start_offset", None)
    return offset(length) if offset is not None else 0


def batches(proposer: Proposer) -> bool:
    """Whether the proposer drafts several sequences in one forward (changes what drafting costs)."""
    return hasattr(proposer, "propose_batch")


class ProposerBase:
    """Defaults for the protocol's declarations and hooks: override what a drafter uses."""

    name = "base"
    needs_hidden = False
    needs_every_step = False
    drafts_free = False
    hidden_layers: tuple[int, ...] = ()
    forwards = 0

    def start(self, seq: Sequence, prompt_hidden: Tensor | None = None) -> None:
        pass

    def on_step(self, seq: Sequence, result: VerifyResult, hidden: Tensor | None) -> None:
        pass

    def finish(self, seq: Sequence) -> None:
        pass


