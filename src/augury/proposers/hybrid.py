"""Hybrid: a free suffix-match draft where it is as good a guess, a draft model's otherwise.

Matching costs nothing and, on repetitive text, drafts long runs the target
accepts; elsewhere it has nothing to say and a small model is the better
guess. Which one is better depends on the match: a match of one or two
tokens is often a coincidence of common tokens, one of 16 the text repeating
itself. So the hybrid counts, per kind of draft (the matcher's by the octave
of its match length, `Draft.bucket`; the model's as bucket 0), how often the
first drafted token was accepted, and on a step the planner gave a draft it
takes the matcher's draft when its bucket's count is at least the model's
(the matcher is free, so it wins ties), the model's otherwise (a seeded
request sampled by rejection, whose text depends on its drafts, takes the
matcher's whenever it has one, as before the counts). An untried
kind counts as always accepted, so each is tried before the counts decide.
A matcher draft must also have at least min(k, min_match_tokens) tokens.
On steps the planner gave no draft the hybrid offers its matcher's draft
alone (`propose_free`), which the planner may verify in part. Where the model
drafts, the matcher's continuation of the draft so far, however short, goes to
it as a guess it checks in each forward (`DraftModelProposer.propose_batch`):
the same draft, in fewer of the model's forwards where the two agree.

Both parts hear every step and each rolls back only what it drafted itself.
After a step the draft model sat out, its cache still holds a prefix of the
committed tokens, and its next propose feeds whatever it has not seen, so its
state stays consistent without any replay. Both parts' drafts go through the
same verifier, so the output is the target's whichever proposed.
"""

from __future__ import annotations

from augury.errors import AuguryError
from augury.models.loader import Model
from augury.proposers.base import (MATCH_BUCKETS, Draft, Proposer, ProposerBase, Sequence, propose_batch,
                                   start_batch, start_offset)
from augury.proposers.suffix import build as build_suffix
from augury.verify import VerifyResult


class HybridProposer(ProposerBase):
    """The matcher when its draft is long enough, the model drafter otherwise."""

    name = "hybrid"

    def __init__(self, matcher: Proposer, model: Proposer, min_match_tokens: int = 2) -> None:
        self.matcher = matcher
        self.model = model
        # A trained head as the fallback reads the target's states: the hybrid asks for what its parts need.
        self.needs_hidden = model.needs_hidden or matcher.needs_hidden
        self.needs_every_step = model.needs_every_step or matcher.needs_every_step
        self.hidden_layers = tuple(model.hidden_layers)
        self.min_match_tokens = min_match_tokens
        self.matcher_drafts = 0  # steps drafted by each part, for reporting
        self.model_drafts = 0
        # Per draft kind (0: the model's, 1..MATCH_BUCKETS: the matcher's by match octave): drafts verified,
        # and those whose first token was accepted.
        self.first_tried = [0] * (MATCH_BUCKETS + 1)
        self.first_accepted = [0] * (MATCH_BUCKETS + 1)
        self._kind: dict[int, int] = {}  # sequence id -> the kind of its pending draft
        # Sequences started here (and so finished here): a free draft of one that never started is
        # neither heard nor finished, so it is not counted (nothing of it would be freed).
        self._started: set[int] = set()

    @property
    def forwards(self) -> int:
        return self.matcher.forwards + self.model.forwards

    def prefix_token_bytes(self) -> int:
        """The model part's K/V bytes per token where it keeps a prefix cache, else 0 (see the scheduler)."""
        return getattr(self.model, "prefix_token_bytes", lambda: 0)()

    def use_prefix_cache(self, prefix) -> None:
        self.model.use_prefix_cache(prefix)

    def start_offset(self, length: int) -> int:
        """The model part's (`proposers.base.start_offset`): the matcher's start costs nothing."""
        return start_offset(self.model, length)

    def start(self, seq: Sequence, prompt_hidden=None) -> None:
        self._started.add(seq.id)
        self.matcher.start(seq, prompt_hidden)
        self.model.start(seq, prompt_hidden)

    def start_batch(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self._started.add(seq.id)
            self.matcher.start(seq, None)
        start_batch(self.model, seqs)

    def prefill_batch(self, seqs: list[Sequence], counts: list[int]) -> list[int]:
        """The model part's pieces (`DraftModelProposer.prefill_batch`), the matcher started beside them
        (starting the suffix matcher again only extends it)."""
        for seq in seqs:
            self._started.add(seq.id)
            self.matcher.start(seq, None)
        return self.model.prefill_batch(seqs, counts)

    def propose(self, seq: Sequence, k: int) -> Draft:
        return self.propose_batch([seq], [k])[0]

    def first_odds(self, kind: int) -> float:
        """How often a draft of this kind had its first token accepted; 1.0 for a kind not yet verified."""
        return (self.first_accepted[kind] + 1) / (self.first_tried[kind] + 1)

    def propose_batch(self, seqs: list[Sequence], ks: list[int], free_ks: list[int] | None = None) -> list[Draft]:
        """Matcher drafts where their kind is accepted at least as often as the model's; the model drafts
        for the rest, in one batch. free_ks: how long a matcher draft may run (free: it costs nothing to
        make, and `Planner.trim` decides how much of it is verified), where longer than ks; the model's
        drafts keep ks, which price its rounds."""
        caps = ks if free_ks is None else [max(k, free) for k, free in zip(ks, free_ks)]
        drafts = [self._matched(seq, cap, k) if k > 0 else Draft([]) for seq, k, cap in zip(seqs, ks, caps)]
        fallback = []
        for i, (seq, k) in enumerate(zip(seqs, ks)):
            # A seeded request sampled by rejection takes any matcher draft long enough: its text must not
            # depend on what other requests taught the counts.
            if k > 0 and len(drafts[i]) and (seq.params.load_dependent
                                             or self.first_odds(drafts[i].bucket) >= self.first_odds(0)):
                self.matcher_drafts += 1
            elif k > 0:
                self.model_drafts += 1
                fallback.append(i)
        if fallback:
            fallen = [seqs[i] for i in fallback]
            guess = getattr(self.matcher, "guess", None)
            if guess is not None and getattr(self.model, "checks_guesses", False):
                # The matcher's continuation of the draft so far, however short, as guesses the model checks
                # in each forward (`DraftModelProposer.propose_batch`): its own draft, in fewer forwards.
                model_drafts = self.model.propose_batch(fallen, [ks[i] for i in fallback], guess)
            else:
                model_drafts = propose_batch(self.model, fallen, [ks[i] for i in fallback])
            for i, draft in zip(fallback, model_drafts):
                drafts[i] = draft
        for seq, draft in zip(seqs, drafts):
            self._kind[seq.id] = draft.bucket
        return drafts

    def propose_free(self, seq: Sequence, k: int) -> Draft:
        """The matcher's draft where it is long enough, else none: what this proposer drafts at no cost,
        offered on steps the planner gave no draft (`step.draft_free`); the model part is never run."""
        draft = self._matched(seq, k, k)
        if seq.id in self._started:
            self._kind[seq.id] = draft.bucket
        return draft

    def _matched(self, seq: Sequence, cap: int, k: int) -> Draft:
        """The matcher's draft of up to cap tokens where it has at least min(k, min_match_tokens)."""
        draft = self.matcher.propose(seq, cap)
        return draft if len(draft) >= min(k, self.min_match_tokens) else Draft([])

    def on_step(self, seq: Sequence, result: VerifyResult, hidden=None) -> None:
        """Both parts hear every step; each rolls back only what it drafted itself. A verified draft
        counts toward its kind's first-token acceptance."""
        kind = self._kind.pop(seq.id, None)
        if kind is not None and result.num_drafted > 0:
            self.first_tried[kind] += 1
            self.first_accepted[kind] += result.num_accepted > 0
        self.matcher.on_step(seq, result, hidden)
        self.model.on_step(seq, result, hidden)

    def finish(self, seq: Sequence) -> None:
        self._kind.pop(seq.id, None)
        self._started.discard(seq.id)
        self.matcher.finish(seq)
        self.model.finish(seq)


def build(target: Model, options) -> HybridProposer:
    """Suffix matcher (with the optional corpus) plus the draft model named by options.draft, or the head
    given by options.head (HybridOptions)."""
    from augury.proposers.draft_model_build import build as build_model

    if options.head:  # a trained head (augury train) instead of a draft model
        from augury.proposers.heads import build as build_head

        return HybridProposer(build_suffix(target, options), build_head(target, options), options.match_min + 1)
    if not options.draft:
        raise AuguryError("draft method 'hybrid' needs --draft NAME_OR_PATH for its fallback draft model")
    return HybridProposer(build_suffix(target, options), build_model(target, options), options.match_min + 1)
