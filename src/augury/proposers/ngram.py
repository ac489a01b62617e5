"""Prompt lookup: copy what followed the latest earlier occurrence of the last n tokens.

Models often repeat spans of their context (code edits, quoted text, lists,
summaries), and when the last few tokens already occurred, the tokens that
followed them then are a free guess at what follows now (Saxena 2023, "prompt
lookup decoding"). No model runs, and the draft is deterministic (q_draft
None), so the verifier treats it as a point mass and the output stays exactly
the target's.

Instead of rescanning the sequence every step, each sequence keeps an index
from every n-gram (ngram_min <= n <= ngram_max) to the position right after
its latest occurrence. seq.tokens only ever grows by committed tokens, so the
index is brought up to date by indexing the new positions (O(ngram_max) per
committed token) and never needs a rollback.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from augury.errors import AuguryError
from augury.models.loader import Model
from augury.proposers.base import Draft, ProposerBase, Sequence, match_bucket


# Every committed position is indexed under each n up to ngram_max: far past any match worth drafting
# from, a huge bound only made each step slower (--ngram-max 100000000: 2.6 s a draft on 2,000 tokens).
NGRAM_MAX_LIMIT = 64


def check_ngram_range(ngram_min: int, ngram_max: int) -> None:
    """Refuse n-gram bounds that cannot describe a lookup, or that would index without bound."""
    if ngram_min < 1:
        raise AuguryError(f"--ngram-min must be at least 1, got {ngram_min}")
    if ngram_max < ngram_min:
        raise AuguryError(f"--ngram-max ({ngram_max}) must be at least --ngram-min ({ngram_min})")
    if ngram_max > NGRAM_MAX_LIMIT:
        raise AuguryError(f"--ngram-max must be at most {NGRAM_MAX_LIMIT}, got {ngram_max}")


@dataclass
class NgramIndex:
    """n-gram -> position right after its latest occurrence, for one token list.

    Only n-grams that end before the last token are indexed (each entry
    therefore has at least one follower), so looking up the list's own suffix
    finds its latest *earlier* occurrence, never the suffix itself.
    """

    ngram_min: int
    ngram_max: int
    after: dict[tuple[int, ...], int] = field(default_factory=dict)
    indexed: int = 0  # the n-grams tokens[end - n : end] are indexed for every end <= indexed

    def update(self, tokens: list[int]) -> None:
        """Index the n-grams ending at each new position, up to but excluding the last token."""
        for end in range(self.indexed + 1, len(tokens)):
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self.after[tuple(tokens[end - n : end])] = end
        self.indexed = max(self.indexed, len(tokens) - 1)

    def lookup(self, tokens: list[int], k: int) -> tuple[list[int], int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest matching suffix,
        and that suffix's length (0: no match)."""
        self.update(tokens)
        for n in range(min(self.ngram_max, len(tokens) - 1), self.ngram_min - 1, -1):
            start = self.after.get(tuple(tokens[len(tokens) - n :]))
            if start is not None:
                return tokens[start : start + k], n
        return [], 0


class NgramProposer(ProposerBase):
    """Prompt lookup over the sequence itself (prompt and generated tokens)."""

    name = "ngram"
    drafts_free = True

    def __init__(self, ngram_min: int = 1, ngram_max: int = 4) -> None:
        check_ngram_range(ngram_min, ngram_max)
        self.ngram_min = ngram_min
        self.ngram_max = ngram_max
        self.indexes: dict[int, NgramIndex] = {}

    def _index(self, seq: Sequence) -> NgramIndex:
        index = self.indexes.get(seq.id)
        if index is None:
            index = self.indexes[seq.id] = NgramIndex(self.ngram_min, self.ngram_max)
        return index

    def start(self, seq: Sequence, prompt_hidden=None) -> None:
        self._index(seq).update(seq.tokens)

    def propose(self, seq: Sequence, k: int) -> Draft:
        tokens, n = self._index(seq).lookup(seq.tokens, k)
        return Draft(tokens, bucket=match_bucket(n)) if tokens else Draft([])

    def finish(self, seq: Sequence) -> None:
        self.indexes.pop(seq.id, None)


def build(target: Model, options) -> NgramProposer:
    """The registry's builder: ngram_min and ngram_max (NgramOptions)."""
    return NgramProposer(options.ngram_min, options.ngram_max)
