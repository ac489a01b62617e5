"""Suffix matching: continue the longest earlier match, choosing continuations by frequency.

A suffix automaton holds every substring of a text in at most 2n states and
grows by one token in amortized O(1) (Blumer et al. 1985), so it can follow a
sequence as it is generated, with no rebuild. Two automata are consulted:

- the sequence's own (prompt plus committed tokens): the state `link(last)` is
  the longest suffix of the text that also occurred earlier, found in O(1);
- a corpus of earlier outputs, shared by every sequence of this proposer and,
  with `--suffix-corpus FILE`, persisted between runs (loaded at build, each
  finished output appended). A sequence follows it with the classic
  matching-statistics walk, again O(1) amortized per token.

The longer of the two matches (at least ngram_min tokens) is continued greedily
for up to k tokens, at each step taking the most frequent next token (ties: the
most recent), as SAM-Decoding (Hu et al. 2024) and SuffixDecoding (Oliaro et
al. 2024) do with their suffix structures. The draft is deterministic
(q_draft None), so verification keeps the output exactly the target's.

Frequencies are exact: after each token every suffix of the text gains one
occurrence, which walks the suffix-link chain of the last state. That chain is
at most (longest repeated suffix + 2) states long, a handful for ordinary text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from augury.errors import AuguryError
from augury.models.loader import Model
from augury.proposers.base import Draft, ProposerBase, Sequence, match_bucket

SEPARATOR = -1  # ends each document in the corpus; never a token, so no match runs across it


class SuffixAutomaton:
    """A suffix automaton over a growing token list, with occurrence counts per state.

    State 0 is the root (the empty string). For each state: `next` its
    transitions, `link` its suffix link, `length` its longest string,
    `count` how many times its strings occur (the size of their end-position
    set) and `latest` where their latest occurrence ends (1-based).
    """

    def __init__(self) -> None:
        self.next: list[dict[int, int]] = [{}]
        self.link: list[int] = [-1]
        self.length: list[int] = [0]
        self.count: list[int] = [0]
        self.latest: list[int] = [0]
        self.last = 0  # the state of the whole text
        self.num_tokens = 0

    def _new_state(self, length: int, nxt: dict[int, int], link: int, count: int, latest: int) -> int:
        self.next.append(nxt)
        self.link.append(link)
        self.length.append(length)
        self.count.append(count)
        self.latest.append(latest)
        return len(self.length) - 1

    def extend(self, token: int) -> None:
        """Append one token to the text."""
        self.num_tokens += 1
        end = self.num_tokens
        cur = self._new_state(self.length[self.last] + 1, {}, 0, 0, end)
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p != -1:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:
                # q's shorter strings now also end here: split them off into a clone,
                # which starts with q's occurrences (the walk below adds this one).
                clone = self._new_state(
                    self.length[p] + 1, dict(self.next[q]), self.link[q], self.count[q], self.latest[q]
                )
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                self.link[q] = clone
                self.link[cur] = clone
        self.last = cur
        # Every suffix of the text has gained an occurrence ending here.
        state = cur
        while state > 0:
            self.count[state] += 1
            self.latest[state] = end
            state = self.link[state]

    def extend_all(self, tokens: list[int]) -> None:
        for token in tokens:
            self.extend(token)

    def repeated_suffix(self) -> tuple[int, int]:
        """(state, length) of the longest suffix of the text that also occurred earlier."""
        state = self.link[self.last] if self.last > 0 else 0
        return state, self.length[state]

    def follow(self, state: int, length: int, token: int) -> tuple[int, int]:
        """Matching statistics: from the longest match of a context, the longest match after one more token."""
        while state > 0 and token not in self.next[state]:
            state = self.link[state]
            length = self.length[state]
        target = self.next[state].get(token)
        if target is None:
            return 0, 0
        return target, length + 1

    def continuation(self, state: int, k: int) -> list[int]:
        """Up to k tokens, each the most frequent (then most recent) successor of the match so far."""
        tokens: list[int] = []
        while len(tokens) < k:
            best, best_key = None, (-1, -1)
            for token, target in self.next[state].items():
                key = (self.count[target], self.latest[target])
                if token != SEPARATOR and key > best_key:
                    best, best_key = token, key
            if best is None:
                break
            tokens.append(best)
            state = self.next[state][best]
        return tokens


class SuffixCorpus:
    """Earlier outputs in one automaton, shared by all sequences, optionally mirrored in a file.

    The file holds one JSON list of token ids per line; ids are the target
    tokenizer's, so a corpus belongs to one tokenizer. `version` changes
    whenever a document is added, telling sequences to re-match.
    """

    def __init__(self, path: str | Path | None = None, vocab_size: int | None = None) -> None:
        self.automaton = SuffixAutomaton()
        self.path = Path(path) if path else None
        self.version = 0
        self.documents = 0
        if self.path is not None:
            self._load(vocab_size)

    def _load(self, vocab_size: int | None) -> None:
        assert self.path is not None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise AuguryError(f"cannot use suffix corpus {self.path}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise AuguryError(f"suffix corpus {self.path} is not a text file of JSON token-id lists") from None
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                tokens = json.loads(line)
                ok = isinstance(tokens, list) and all(type(t) is int and t >= 0 for t in tokens)  # not true/false
            except json.JSONDecodeError:
                ok = False
            if not ok:
                raise AuguryError(f"suffix corpus {self.path} line {number} is not a JSON list of token ids")
            if vocab_size is not None and any(t >= vocab_size for t in tokens):
                raise AuguryError(
                    f"suffix corpus {self.path} line {number} has token ids beyond the target's vocabulary "
                    f"of {vocab_size} (written for another tokenizer?)"
                )
            self._add(tokens)

    def _add(self, tokens: list[int]) -> None:
        self.automaton.extend_all(tokens)
        self.automaton.extend(SEPARATOR)
        self.documents += 1
        self.version += 1

    def add(self, tokens: list[int]) -> None:
        """Add one finished output, in memory and (when there is a file) on disk."""
        if not tokens:
            return
        self._add(tokens)
        if self.path is not None:
            try:
                with self.path.open("a") as f:
                    f.write(json.dumps(tokens) + "\n")
            except OSError as e:
                raise AuguryError(f"cannot append to suffix corpus {self.path}: {e.strerror or e}") from None


@dataclass
class _SuffixState:
    own: SuffixAutomaton
    corpus_state: int = 0  # longest match of the sequence's tokens in the corpus automaton
    corpus_length: int = 0
    corpus_fed: int = 0  # how many of seq.tokens the corpus match has followed
    corpus_version: int = -1


class SuffixProposer(ProposerBase):
    """Drafts from the longest suffix match in the sequence itself or in the corpus of earlier outputs."""

    name = "suffix"
    drafts_free = True

    def __init__(self, ngram_min: int = 1, corpus: SuffixCorpus | None = None) -> None:
        if ngram_min < 1:  # the CLI's --match-min
            raise AuguryError(f"--match-min must be at least 1, got {ngram_min}")
        self.ngram_min = ngram_min
        self.corpus = corpus if corpus is not None else SuffixCorpus()
        self.states: dict[int, _SuffixState] = {}

    def _state(self, seq: Sequence) -> _SuffixState:
        """The sequence's state, brought up to date with its committed tokens."""
        state = self.states.get(seq.id)
        if state is None:
            state = self.states[seq.id] = _SuffixState(SuffixAutomaton())
        state.own.extend_all(seq.tokens[state.own.num_tokens :])
        corpus = self.corpus.automaton
        if state.corpus_version != self.corpus.version:
            # The corpus grew (clones may have split states): match again from the start.
            state.corpus_state, state.corpus_length, state.corpus_fed = 0, 0, 0
            state.corpus_version = self.corpus.version
        for token in seq.tokens[state.corpus_fed :]:
            state.corpus_state, state.corpus_length = corpus.follow(state.corpus_state, state.corpus_length, token)
        state.corpus_fed = len(seq.tokens)
        return state

    def start(self, seq: Sequence, prompt_hidden=None) -> None:
        self._state(seq)

    def propose(self, seq: Sequence, k: int) -> Draft:
        return self._draft(seq, [], k)

    def guess(self, seq: Sequence, drafted: list[int], k: int) -> list[int]:
        """Up to k tokens to follow seq.tokens + drafted (a model's draft so far), matched as `propose`
        matches but without adding the drafted tokens to anything: the hybrid's guesses for its model
        (`DraftModelProposer.propose_batch`)."""
        return self._draft(seq, drafted, k).tokens

    def _draft(self, seq: Sequence, drafted: list[int], k: int) -> Draft:
        """The draft from the longest match of seq.tokens followed by `drafted` (in neither automaton)."""
        state = self._state(seq)
        own_state, own_length = state.own.repeated_suffix()
        corpus_state, corpus_length = state.corpus_state, state.corpus_length
        for token in drafted:
            own_state, own_length = state.own.follow(own_state, own_length, token)
            corpus_state, corpus_length = self.corpus.automaton.follow(corpus_state, corpus_length, token)
        matches = [
            (own_length, 1, state.own, own_state),
            (corpus_length, 0, self.corpus.automaton, corpus_state),
        ]
        # Longest match first; on a tie the sequence's own text, the more specific source.
        for length, _, automaton, match in sorted(matches, key=lambda m: m[:2], reverse=True):
            if length < self.ngram_min:
                break
            tokens = automaton.continuation(match, k)
            if tokens:
                return Draft(tokens, bucket=match_bucket(length))
        return Draft([])

    def finish(self, seq: Sequence) -> None:
        self.states.pop(seq.id, None)
        self.corpus.add(seq.output)


def build(target: Model, options) -> SuffixProposer:
    """The registry's builder: match_min and the optional corpus file (SuffixOptions)."""
    return SuffixProposer(options.match_min, SuffixCorpus(options.suffix_corpus, target.config.vocab_size))
