"""Hybrid: a free suffix-match draft when there is a good one, a draft model's otherwise.

Matching costs nothing and, on repetitive text, drafts long runs the target
accepts; elsewhere it has nothing to say and a small model is the better
guess. Per step the rule is: take the matcher's draft when it has at least
min(k, match_min + 1) tokens, otherwise let the draft model propose. A match
that only yields one or two tokens is often a coincidence of common tokens,
and a longer continuation means the match kept holding in the text, so this
asks a little more than the matcher's own minimum before skipping the model;
with k = 1 any matched token is as long as the model's draft and is taken.

Both parts hear every step and each rolls back only what it drafted itself.
After a step the draft model sat out, its cache still holds a prefix of the
committed tokens, and its next propose feeds whatever it has not seen, so its
state stays consistent without any replay. Both parts' drafts go through the
same verifier, so the output is the target's whichever proposed.
"""

from __future__ import annotations

from augury.errors import AuguryError
from augury.models.loader import Model
from augury.proposers.base import Draft, Proposer, ProposerBase, Sequence, propose_batch, start_batch
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

    @property
    def forwards(self) -> int:
        return self.matcher.forwards + self.model.forwards

    def prefix_token_bytes(self) -> int:
        """The model part's K/V bytes per token where it keeps a prefix cache, else 0 (see the scheduler)."""
        return getattr(self.model, "prefix_token_bytes", lambda: 0)()

    def use_prefix_cache(self, prefix) -> None:
        self.model.use_prefix_cache(prefix)

    def start(self, seq: Sequence, prompt_hidden=None) -> None:
        self.matcher.start(seq, prompt_hidden)
        self.model.start(seq, prompt_hidden)

    def start_batch(self, seqs: list[Sequence]) -> None:
        for seq in seqs:
            self.matcher.start(seq, None)
        start_batch(self.model, seqs)

    def prefill_batch(self, seqs: list[Sequence], counts: list[int]) -> list[int]:
        """The model part's pieces (`DraftModelProposer.prefill_batch`), the matcher started beside them
        (starting the suffix matcher again only extends it)."""
        for seq in seqs:
            self.matcher.start(seq, None)
        return self.model.prefill_batch(seqs, counts)

    def propose(self, seq: Sequence, k: int) -> Draft:
        return self.propose_batch([seq], [k])[0]

    def propose_batch(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        """Matcher drafts where they are long enough; the model drafts for the rest, in one batch."""
        drafts = [self.propose_free(seq, k) if k > 0 else Draft([]) for seq, k in zip(seqs, ks)]
        fallback = []
        for i, (seq, k) in enumerate(zip(seqs, ks)):
            if k > 0 and len(drafts[i]):
                self.matcher_drafts += 1
            elif k > 0:
                self.model_drafts += 1
                fallback.append(i)
        if fallback:
            model_drafts = propose_batch(self.model, [seqs[i] for i in fallback], [ks[i] for i in fallback])
            for i, draft in zip(fallback, model_drafts):
                drafts[i] = draft
        return drafts

    def propose_free(self, seq: Sequence, k: int) -> Draft:
        """The matcher's draft where it is long enough, else none: what this proposer drafts at no cost,
        offered on steps the planner gave no draft (`step.draft_free`); the model part is never run."""
        draft = self.matcher.propose(seq, k)
        return draft if len(draft) >= min(k, self.min_match_tokens) else Draft([])

    def on_step(self, seq: Sequence, result: VerifyResult, hidden=None) -> None:
        """Both parts hear every step; each rolls back only what it drafted itself."""
        self.matcher.on_step(seq, result, hidden)
        self.model.on_step(seq, result, hidden)

    def finish(self, seq: Sequence) -> None:
        self.matcher.finish(seq)
        self.model.finish(seq)


def build(target: Model, options) -> HybridProposer:
    """Suffix matcher (with the optional corpus) plus the draft model named by options.draft, or the head
    given by options.head (HybridOptions)."""
    from augury.proposers.draft_model import build as build_model

    if options.head:  # a trained head (augury train) instead of a draft model
        from augury.proposers.heads import build as build_head

        return HybridProposer(build_suffix(target, options), build_head(target, options), options.match_min + 1)
    if not options.draft:
        raise AuguryError("draft method 'hybrid' needs --draft NAME_OR_PATH for its fallback draft model")
    return HybridProposer(build_suffix(target, options), build_model(target, options), options.match_min + 1)
