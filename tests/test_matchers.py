"""Model-free drafters (prompt lookup, suffix automaton) and the hybrid that falls back to a model.

Each matcher is checked on hand-made sequences (longest match, latest or most
frequent continuation, no match, caps), its incremental state against a
brute-force reference over random sequences, the suffix corpus through a file,
and every drafter in the engine against plain greedy decoding.
"""

from __future__ import annotations

import json
import random

import pytest

from augury.engine import Engine
from augury.errors import AuguryError
from augury.proposers import ProposerBase, build_proposer
from augury.proposers.base import Draft, Sequence
from augury.proposers.draft_model import DraftModelProposer
from augury.proposers.hybrid import HybridProposer
from augury.proposers.ngram import NgramProposer
from augury.proposers.suffix import SuffixAutomaton, SuffixCorpus, SuffixProposer
from augury.sampling import SamplingParams
from tests.tiny import tiny_model

GREEDY = SamplingParams(max_tokens=40)


def seq_of(tokens: list[int], prompt_len: int = -1) -> Sequence:
    return Sequence(list(tokens), GREEDY, prompt_len=prompt_len)


def propose_once(proposer, tokens: list[int], k: int) -> list[int]:
    seq = seq_of(tokens)
    proposer.start(seq)
    draft = proposer.propose(seq, k)
    assert draft.q_draft is None, "matchers propose deterministic drafts"
    proposer.finish(seq)
    return draft.tokens


# -- brute-force references ------------------------------------------------------------------


def occurrences(tokens: list[int], pattern: list[int]) -> list[int]:
    """End positions (exclusive) of every occurrence of pattern in tokens."""
    n = len(pattern)
    return [end for end in range(n, len(tokens) + 1) if tokens[end - n : end] == pattern]


def reference_lookup(tokens: list[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Prompt lookup by rescanning: longest n first, latest earlier occurrence."""
    for n in range(min(n_max, len(tokens) - 1), n_min - 1, -1):
        earlier = [end for end in occurrences(tokens, tokens[-n:]) if end < len(tokens)]
        if earlier:
            return tokens[earlier[-1] : earlier[-1] + k]
    return []


def reference_suffix(tokens: list[int], k: int, n_min: int) -> list[int]:
    """Longest suffix that occurred earlier, extended by the most frequent (then latest) next token."""
    def occurred_earlier(n: int) -> bool:
        return any(end < len(tokens) for end in occurrences(tokens, tokens[len(tokens) - n :]))

    length = max((n for n in range(len(tokens)) if occurred_earlier(n)), default=0)
    return reference_continuation(tokens, tokens[len(tokens) - length :], k) if length >= n_min else []


def reference_continuation(tokens: list[int], context: list[int], k: int) -> list[int]:
    """Up to k tokens after context, each the most frequent (then latest) next token in tokens."""
    context, out = list(context), []
    while len(out) < k:
        best = None
        for token in set(tokens):
            ends = occurrences(tokens, context + [token])
            if ends and (best is None or (len(ends), ends[-1]) > best[0]):
                best = ((len(ends), ends[-1]), token)
        if best is None:
            break
        out.append(best[1])
        context.append(best[1])
    return out


# -- prompt lookup ---------------------------------------------------------------------------


def test_ngram_prefers_longest_match_over_a_later_shorter_one():
    tokens = [1, 2, 3, 4, 0, 2, 3, 7, 0, 1, 2, 3]
    assert propose_once(NgramProposer(1, 3), tokens, 2) == [4, 0]
    # Limited to 2-grams, the latest "2 3" (followed by 7) wins.
    assert propose_once(NgramProposer(1, 2), tokens, 2) == [7, 0]


def test_ngram_uses_the_latest_occurrence():
    assert propose_once(NgramProposer(1, 4), [5, 6, 1, 5, 6, 2, 5, 6], 1) == [2]


def test_ngram_no_proposal_without_a_match():
    assert propose_once(NgramProposer(1, 4), [1, 2, 3, 4], 4) == []
    # Only a 1-gram matches, and 2 is the minimum.
    assert propose_once(NgramProposer(2, 4), [1, 2, 3, 4, 1], 4) == []
    # The suffix itself never counts as its own occurrence.
    assert propose_once(NgramProposer(1, 4), [3], 4) == []


def test_ngram_caps_at_k_and_at_the_end_of_the_text():
    tokens = [1, 2, 3, 4, 5, 6, 1]
    assert propose_once(NgramProposer(1, 4), tokens, 3) == [2, 3, 4]
    assert propose_once(NgramProposer(1, 4), tokens, 10) == [2, 3, 4, 5, 6, 1]
    assert propose_once(NgramProposer(1, 4), [7, 7], 5) == [7]


def test_ngram_incremental_index_equals_rescanning():
    rng = random.Random(0)
    for trial in range(30):
        n_min, n_max = rng.randint(1, 3), rng.randint(3, 5)
        tokens = [rng.randrange(4) for _ in range(rng.randint(1, 8))]
        proposer = NgramProposer(n_min, n_max)
        seq = seq_of(tokens)
        proposer.start(seq)
        for _ in range(50):
            k = rng.randint(1, 6)
            got = proposer.propose(seq, k).tokens
            assert got == reference_lookup(seq.tokens, k, n_min, n_max), (trial, seq.tokens, k)
            # Commit a few tokens, sometimes following the draft (as acceptance would).
            step = got[: rng.randint(0, len(got))] + [rng.randrange(4)]
            seq.tokens.extend(step)


def test_ngram_rejects_bad_bounds():
    with pytest.raises(AuguryError, match="ngram-min"):
        NgramProposer(0, 3)
    with pytest.raises(AuguryError, match="ngram-max"):
        NgramProposer(3, 2)


# -- suffix automaton ------------------------------------------------------------------------


def walk(automaton: SuffixAutomaton, pattern: list[int]) -> int | None:
    state = 0
    for token in pattern:
        state = automaton.next[state].get(token)
        if state is None:
            return None
    return state


def test_suffix_automaton_counts_match_brute_force():
    rng = random.Random(1)
    for _ in range(20):
        tokens = [rng.randrange(3) for _ in range(rng.randint(1, 40))]
        automaton = SuffixAutomaton()
        automaton.extend_all(tokens)
        assert len(automaton.length) <= max(2 * len(tokens) - 1, 2)
        for n in range(1, 5):
            for pattern in {tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)}:
                state = walk(automaton, list(pattern))
                ends = occurrences(tokens, list(pattern))
                assert state is not None
                assert (automaton.count[state], automaton.latest[state]) == (len(ends), ends[-1]), (tokens, pattern)
        absent = [rng.randrange(3, 5)]
        assert walk(automaton, absent) is None


def test_suffix_prefers_longest_match_over_a_later_shorter_one():
    tokens = [1, 2, 3, 4, 0, 2, 3, 7, 0, 1, 2, 3]
    assert propose_once(SuffixProposer(1), tokens, 2) == [4, 0]


def test_suffix_prefers_the_most_frequent_continuation():
    # "1 2" went on as "3" twice and as "4" once (most recently): frequency wins.
    tokens = [1, 2, 3, 1, 2, 3, 1, 2, 4, 0, 1, 2]
    assert propose_once(SuffixProposer(1), tokens, 3) == [3, 1, 2]
    assert propose_once(NgramProposer(1, 2), tokens, 1) == [4], "prompt lookup takes the latest instead"
    # On equal counts the most recent continuation is taken.
    assert propose_once(SuffixProposer(1), [1, 2, 3, 1, 2, 4, 1, 2], 1) == [4]


def test_suffix_no_proposal_without_a_long_enough_match():
    assert propose_once(SuffixProposer(1), [1, 2, 3, 4], 4) == []
    assert propose_once(SuffixProposer(2), [1, 2, 3, 4, 1], 4) == []
    assert propose_once(SuffixProposer(1), [3], 4) == []


def test_suffix_caps_at_k_and_at_the_end_of_the_text():
    tokens = [1, 2, 3, 4, 5, 6, 1]
    assert propose_once(SuffixProposer(1), tokens, 3) == [2, 3, 4]
    assert propose_once(SuffixProposer(1), tokens, 10) == [2, 3, 4, 5, 6, 1]


def test_suffix_incremental_equals_rebuild_and_brute_force():
    rng = random.Random(2)
    for trial in range(25):
        n_min = rng.randint(1, 3)
        tokens = [rng.randrange(3) for _ in range(rng.randint(1, 6))]
        proposer = SuffixProposer(n_min)
        seq = seq_of(tokens)
        proposer.start(seq)
        for _ in range(30):
            k = rng.randint(1, 6)
            got = proposer.propose(seq, k).tokens
            assert got == propose_once(SuffixProposer(n_min), seq.tokens, k), (trial, seq.tokens)
            assert got == reference_suffix(seq.tokens, k, n_min), (trial, seq.tokens, k)
            seq.tokens.extend(got[: rng.randint(0, len(got))] + [rng.randrange(3)])


def reference_guess(tokens: list[int], drafted: list[int], k: int, n_min: int) -> list[int]:
    """The longest suffix of tokens + drafted that occurs in tokens (the drafted tokens are no text to
    match in), extended by the most frequent (then latest) next token in tokens."""
    if not drafted:
        return reference_suffix(tokens, k, n_min)
    text = tokens + drafted
    length = max((n for n in range(len(text)) if occurrences(tokens, text[len(text) - n :])), default=0)
    return reference_continuation(tokens, text[len(text) - length :], k) if length >= n_min else []


def test_suffix_guess_after_drafted_tokens_matches_brute_force_and_changes_nothing():
    """`guess` (the hybrid's guesses for its model) continues the text as if the drafted tokens followed
    it, matching in the committed text only, and leaves the proposer as it was."""
    rng = random.Random(5)
    for trial in range(200):
        n_min = rng.randint(1, 2)
        tokens = [rng.randrange(3) for _ in range(rng.randint(1, 12))]
        drafted = [rng.randrange(3) for _ in range(rng.randint(0, 4))]
        k = rng.randint(1, 5)
        proposer = SuffixProposer(n_min)
        seq = seq_of(tokens)
        proposer.start(seq)
        before = proposer.propose(seq, 4).tokens
        assert proposer.guess(seq, drafted, k) == reference_guess(tokens, drafted, k, n_min), (tokens, drafted, k)
        assert proposer.propose(seq, 4).tokens == before
        assert proposer.states[seq.id].own.num_tokens == len(tokens)


def test_suffix_guess_follows_a_corpus_document_through_drafted_tokens():
    proposer = SuffixProposer(2)
    generate_into(proposer, [9, 9], [1, 2, 3, 4, 5, 6])
    seq = seq_of([7, 8, 1, 2])
    proposer.start(seq)
    assert proposer.guess(seq, [3, 4], 2) == [5, 6]
    assert proposer.guess(seq, [3, 9], 2) == [], "a drafted token the corpus never had ends the match"
    assert proposer.propose(seq, 2).tokens == [3, 4]


# -- suffix corpus ---------------------------------------------------------------------------


def generate_into(proposer, prompt: list[int], output: list[int]) -> None:
    """Play one finished sequence through a proposer, as the engine would."""
    seq = seq_of(prompt)
    proposer.start(seq)
    for token in output:
        proposer.propose(seq, 4)
        seq.tokens.append(token)
    proposer.finish(seq)


def test_corpus_shares_outputs_between_sequences():
    proposer = SuffixProposer(2)
    generate_into(proposer, [9, 9], [1, 2, 3, 4, 5])
    assert propose_once(proposer, [7, 8, 1, 2], 3) == [3, 4, 5]
    assert propose_once(SuffixProposer(2), [7, 8, 1, 2], 3) == [], "without the corpus nothing matches"


def test_corpus_outputs_only_and_no_match_across_documents():
    proposer = SuffixProposer(1)
    generate_into(proposer, [6, 6, 6], [1, 2])
    generate_into(proposer, [6, 6, 6], [3, 4])
    assert proposer.corpus.documents == 2
    assert propose_once(proposer, [0, 6], 3) == [], "prompts are not part of the corpus"
    assert propose_once(proposer, [0, 2], 3) == [], "a document's end does not run into the next"
    assert propose_once(proposer, [0, 3], 3) == [4]


def test_corpus_round_trip_through_a_file(tmp_path):
    path = tmp_path / "sub" / "corpus.jsonl"
    proposer = build_proposer("suffix", tiny_model(vocab=16), suffix_corpus=str(path), match_min=2)
    generate_into(proposer, [0], [1, 2, 3, 4, 5])
    generate_into(proposer, [0], [6, 7, 1, 2, 8])
    assert [json.loads(line) for line in path.read_text().splitlines()] == [[1, 2, 3, 4, 5], [6, 7, 1, 2, 8]]

    reloaded = SuffixProposer(2, SuffixCorpus(path, vocab_size=16))
    assert reloaded.corpus.documents == 2
    # "1 2" went on to "3" once and "8" once (later): the later wins the tie.
    assert propose_once(reloaded, [0, 1, 2], 3) == [8]
    assert propose_once(reloaded, [0, 7, 1, 2], 3) == [8]
    assert propose_once(reloaded, [0, 2, 3], 3) == [4, 5]


def test_corpus_reaches_sequences_already_running():
    proposer = SuffixProposer(2)
    running = seq_of([5, 1, 2])
    proposer.start(running)
    assert proposer.propose(running, 3).tokens == []
    generate_into(proposer, [0], [1, 2, 3, 4])
    assert proposer.propose(running, 3).tokens == [3, 4]


def test_corpus_file_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 2]\nnot json\n")
    with pytest.raises(AuguryError, match="line 2"):
        SuffixCorpus(bad)
    wide = tmp_path / "wide.jsonl"
    wide.write_text("[1, 200]\n")
    with pytest.raises(AuguryError, match="vocabulary"):
        SuffixCorpus(wide, vocab_size=16)


# -- hybrid ----------------------------------------------------------------------------------


class Recording(ProposerBase):
    """A proposer stub that drafts a fixed list and records the feedback it hears."""

    name = "recording"

    def __init__(self, draft: list[int]) -> None:
        self.draft = draft
        self.proposed = 0
        self.verified: list[tuple[int, int]] = []

    def propose(self, seq, k):
        self.proposed += 1
        return Draft(self.draft[:k])

    def on_step(self, seq, result, hidden):
        self.verified.append((result.num_drafted, result.num_accepted))



@pytest.mark.parametrize(
    "matched, k, expect", [([1, 2], 4, "matcher"), ([1], 4, "model"), ([], 4, "model"), ([1], 1, "matcher")]
)
def test_hybrid_routes_drafts_and_both_parts_hear_every_step(matched, k, expect):
    from augury.verify import VerifyResult

    matcher, model = Recording(matched), Recording([5, 5, 5, 5])
    hybrid = HybridProposer(matcher, model, min_match_tokens=2)
    seq = seq_of([0, 1, 2])
    hybrid.start(seq)
    draft = hybrid.propose(seq, k)
    hybrid.on_step(seq, VerifyResult(len(draft), 0, [7]), None)
    chosen = matcher if expect == "matcher" else model
    assert draft.tokens == chosen.draft[:k]
    assert matcher.verified == model.verified == [(len(draft), 0)]
    assert model.proposed == (expect == "model")


def test_hybrid_takes_the_matcher_where_its_match_length_is_accepted_as_often_as_the_model():
    """Per kind of draft (the matcher's match octave; the model's), the hybrid counts first-token
    acceptance: a kind not yet verified is tried, a short-match kind the target keeps rejecting gives
    way to the model, a long-match kind it accepts keeps the step; a seeded request sampled by rejection
    takes the matcher's draft whatever the counts say (its text must not depend on other requests)."""
    from augury.verify import VerifyResult

    class ByBucket(Recording):
        def __init__(self, bucket_of: dict[int, int]) -> None:
            super().__init__([1, 2, 3, 4])
            self.bucket_of = bucket_of  # first prompt token -> the bucket of its match

        def propose(self, seq, k):
            self.proposed += 1
            return Draft(self.draft[:k], bucket=self.bucket_of[seq.tokens[0]])

    matcher, model = ByBucket({0: 1, 9: 5}), Recording([5, 5, 5, 5])
    hybrid = HybridProposer(matcher, model, min_match_tokens=2)
    short, long = seq_of([0, 1, 2]), seq_of([9, 1, 2])
    for seq in (short, long):
        hybrid.start(seq)

    def step(seq, accepted: int) -> str:
        draft = hybrid.propose(seq, 4)
        hybrid.on_step(seq, VerifyResult(len(draft), accepted, [7]), None)
        return "model" if draft.tokens == [5, 5, 5, 5] else "matcher"

    assert step(short, 0) == "matcher"  # untried: the free one first
    assert step(short, 3) == "model"  # bucket 1 now 1/2 against the untried model's 1
    assert [step(short, 3) for _ in range(3)] == ["model"] * 3  # the model's 2/2, 3/3, ...
    assert [step(long, 4) for _ in range(3)] == ["matcher"] * 3  # bucket 5: 1.0, as often as the model
    assert hybrid.first_tried[1] == 1 and hybrid.first_accepted[5] == 3 and hybrid.first_tried[0] == 4
    seeded = Sequence([0, 1, 2], SamplingParams(temperature=0.8, seed=3, coupling="rejection"))
    hybrid.start(seeded)
    assert step(seeded, 0) == "matcher"
    unstarted = seq_of([9, 1, 2])  # a free draft of a sequence the driver never started: nothing is kept
    assert len(hybrid.propose_free(unstarted, 4)) == 4 and unstarted.id not in hybrid._kind
    for seq in (short, long, seeded):
        hybrid.finish(seq)
    assert not hybrid._kind and not hybrid._started, "a finished sequence left state behind"


def test_hybrid_model_drafter_stays_in_sync_when_the_matcher_drafts():
    """With draft = target (greedy, fp32) every model draft must be accepted in full.

    The matcher drafts on some steps and the model sits them out; if the
    model's cache missed or double-counted those tokens its drafts would stop
    matching the target.
    """
    target = tiny_model(vocab=8)
    model = DraftModelProposer(tiny_model(vocab=8), 8)
    recorded: list[tuple[int, int]] = []
    on_step = model.on_step

    def record(seq, result, hidden):
        drafted = len(model.states[seq.id].drafted)
        if drafted:  # a step the model drafted for (not one the matcher drafted)
            recorded.append((drafted, result.num_accepted))
        on_step(seq, result, hidden)

    model.on_step = record
    hybrid = HybridProposer(SuffixProposer(1), model, min_match_tokens=2)
    prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    result = Engine(target, hybrid, k=4).generate(prompt, GREEDY)
    assert hybrid.matcher_drafts > 0 and hybrid.model_drafts > 0, "both parts should have drafted"
    assert recorded and all(a == d for d, a in recorded), f"model drafts rejected: {recorded}"
    assert result.token_ids == Engine(target).generate(prompt, GREEDY).token_ids


def test_hybrid_needs_a_draft_model():
    with pytest.raises(AuguryError, match="--draft"):
        build_proposer("hybrid", tiny_model(vocab=8), draft=None)


# -- engine: greedy equivalence --------------------------------------------------------------

DRAFTERS = {
    "ngram": lambda target: NgramProposer(1, 4),
    "suffix": lambda target: SuffixProposer(1),
    "hybrid": lambda target: HybridProposer(
        SuffixProposer(1), DraftModelProposer(tiny_model(vocab=8, seed=1), 8), min_match_tokens=2
    ),
}


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("method", sorted(DRAFTERS))
def test_greedy_speculative_equals_plain(method, k):
    target = tiny_model(vocab=8)
    prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    plain = Engine(target).generate(prompt, GREEDY)
    result = Engine(target, DRAFTERS[method](target), k=k).generate(prompt, GREEDY)
    assert result.token_ids == plain.token_ids
    assert result.stats.accepted > 0, f"{method} drafted {result.stats.drafted} tokens and none was accepted"
    assert len(result.stats.drafted_at) <= k, "a draft longer than k"


@pytest.mark.parametrize("curve", ["flat", "steep"])
@pytest.mark.parametrize("method", sorted(DRAFTERS))
def test_greedy_equals_plain_when_the_planner_trims_drafts(method, curve):
    """The adaptive engine drafts what the matchers offer for free and `Planner.trim` cuts each draft to
    what its bucket's acceptance pays for at the given cost curve: still the plain text, token for token.
    On a flat curve (verification free) drafts are kept and accepted; on a steep one (a drafted token
    costs two plain steps) most are cut to nothing."""
    target = tiny_model(vocab=8)
    prompt = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3]
    costs = {"flat": {t: 30.0 + 0.1 * t for t in range(1, 6)}, "steep": {t: 30.0 + 60.0 * (t - 1) for t in range(1, 6)}}
    engine = Engine(target, DRAFTERS[method](target), k=4, adaptive=True, curve=costs[curve])
    engine.planner.costs.observe_target = lambda *args: None  # the plan rests on the curve, not on this machine
    plain = Engine(target).generate(prompt, GREEDY)
    result = engine.generate(prompt, GREEDY)
    assert result.token_ids == plain.token_ids
    verified = engine.last_plan.k_counts
    if curve == "flat":
        assert result.stats.accepted > 0 and engine.planner.by_bucket, f"{method}: {engine.last_plan.line()}"
    else:
        assert verified[0] > sum(verified) / 2, f"{method}: most steps should verify nothing: {verified}"


def test_matcher_drafts_carry_the_octave_of_their_match_length():
    """A draft's bucket tells a one-token match (bucket 1) from a long one, for the planner's tallies."""
    from augury.proposers.base import match_bucket

    assert [match_bucket(n) for n in (1, 2, 3, 4, 7, 8, 15, 16, 400)] == [1, 2, 2, 3, 3, 4, 4, 5, 5]
    long = list(range(10, 30))
    for proposer in (SuffixProposer(1), NgramProposer(1, 4)):
        seq = seq_of([5, 1, 2] + long + [9, 5] + long[:12])  # "5" matches once; the tail matches 12 tokens
        proposer.start(seq)
        draft = proposer.propose(seq, 4)
        assert draft.tokens == long[12:16]
        expected = match_bucket(12) if isinstance(proposer, SuffixProposer) else match_bucket(4)  # ngram_max 4
        assert draft.bucket == expected, f"{proposer.name}: bucket {draft.bucket}"
        short = seq_of([5, 1, 2, 3, 5])
        proposer.start(short)
        assert proposer.propose(short, 2).bucket == 1, f"{proposer.name}: a one-token match"


def test_hybrid_free_drafts_never_run_the_model():
    """`propose_free` offers the matcher's draft where it is long enough and nothing otherwise, without
    starting or running the model part (a hybrid's free drafts on steps the plan gave no draft)."""
    matcher, model = Recording([1, 2]), Recording([5, 5, 5, 5])
    hybrid = HybridProposer(matcher, model, min_match_tokens=2)
    seq = seq_of([0, 1, 2])
    assert hybrid.propose_free(seq, 4).tokens == [1, 2]
    matcher.draft = [1]
    assert hybrid.propose_free(seq, 4).tokens == []
    assert model.proposed == 0


class Matched(Recording):
    """A matcher stub: a fixed draft from a match of a given length's bucket."""

    def __init__(self, draft: list[int], bucket: int) -> None:
        super().__init__(draft)
        self.bucket = bucket

    def propose(self, seq, k):
        self.proposed += 1
        return Draft(self.draft[:k], bucket=self.bucket)


def test_a_hybrids_matcher_draft_runs_past_a_short_plan():
    """The plan's K prices a model's drafting rounds: on a step planned at K = 1, a hybrid's matcher
    draft (free) still runs to the driver's longest (`free_k`, what `Planner.trim` then cuts), while
    the model's draft keeps the plan's K and a matcher draft is not stretched where no free_k is given."""
    from augury.request import Request
    from augury.step import draft

    matcher, model = Matched([1, 2, 3, 4], bucket=3), Recording([5, 5, 5, 5])
    hybrid = HybridProposer(matcher, model, min_match_tokens=2)
    request = Request(tiny_model(vocab=8), [0, 1, 2], SamplingParams(max_tokens=40), hybrid)
    draft(hybrid, [request], [1], free_k=4)
    assert (request.draft.tokens, request.draft.bucket) == ([1, 2, 3, 4], 3)
    assert matcher.proposed == 1  # the matcher is asked once, for the free length
    draft(hybrid, [request], [1])
    assert request.draft.tokens == [1]
    matcher.draft = []  # nothing matched: the model drafts, at the plan's K
    draft(hybrid, [request], [1], free_k=4)
    assert (request.draft.tokens, model.proposed) == ([5], 1)
    request.close()


def test_corpus_files_that_are_not_token_id_lines_are_refused(tmp_path):
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xc3\x28\x00\xff")
    with pytest.raises(AuguryError, match="not a text file of JSON token-id lists"):
        SuffixCorpus(binary)
    booleans = tmp_path / "booleans.jsonl"
    booleans.write_text("[true, false, 1]\n")  # JSON booleans are ints to Python, not token ids
    with pytest.raises(AuguryError, match="line 1 is not a JSON list of token ids"):
        SuffixCorpus(booleans)


def test_matcher_bounds_are_named_as_the_cli_spells_them():
    with pytest.raises(AuguryError, match="--match-min must be at least 1, got -3"):
        SuffixProposer(-3)
    with pytest.raises(AuguryError, match="--ngram-max must be at most 64, got 100000000"):
        NgramProposer(1, 100_000_000)
    assert NgramProposer(1, 64).ngram_max == 64
