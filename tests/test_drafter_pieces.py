"""A model drafter's prefill in pieces: the batching server starts a drafter on a long prompt a piece per step.

With prompts in pieces (scheduler.py), a request whose drafter is further
behind than one step's budget is fed a piece of what the drafter has not seen
instead of drafting (`step.prefill_drafters`, `DraftModelProposer.prefill_batch`),
so the streams beside it never wait for a whole drafter prefill. The drafter's
rows only shape its guesses; still, on the native layer (each row computed
alone) the pieces hold exactly the rows of a whole start, so its drafts are
the same too.
"""

from __future__ import annotations

import pytest
import torch

from augury.engine import Engine
from augury.proposers.base import Sequence
from augury.proposers.draft_model import DraftModelProposer
from augury.proposers.hybrid import HybridProposer
from augury.proposers.suffix import SuffixCorpus, SuffixProposer
from augury.sampling import SamplingParams
from augury.scheduler import Failed, Finished, Scheduler, SchedulerConfig
from tests.native_tiny import VOCAB, native_model
from tests.tiny import run_scheduler, stream_then_late
from tests.test_chunked_prefill import _kernel, target, tokens  # noqa: F401 (fixtures: no kernel, no test)


@pytest.fixture(scope="module")
def drafter_model():
    return native_model("qwen2", seed=9)


class Recording(DraftModelProposer):
    """A model drafter that records how it was started: whole (`start_batch`) or in pieces, per sequence."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.whole: list[int] = []  # tokens of each whole start
        self.pieces: list[list[int]] = []  # tokens fed per call of prefill_batch, per sequence

    def start_batch(self, seqs):
        self.whole += [len(seq.tokens) - 1 for seq in seqs]
        super().start_batch(seqs)

    def prefill_batch(self, seqs, counts):
        before = [self.states[seq.id].fed if seq.id in self.states else 0 for seq in seqs]
        seen = super().prefill_batch(seqs, counts)
        self.pieces.append([after - b for after, b in zip(seen, before)])
        return seen


def test_pieces_hold_a_whole_starts_rows_and_draft_the_same(drafter_model):
    params = SamplingParams(max_tokens=16)
    prompt = tokens(41, seed=1)
    whole, pieces = DraftModelProposer(drafter_model, VOCAB), DraftModelProposer(drafter_model, VOCAB)
    seq_whole, seq_pieces = Sequence(list(prompt), params), Sequence(list(prompt), params)
    whole.start(seq_whole)
    seen = [pieces.prefill_batch([seq_pieces], [n])[0] for n in (7, 7, 1, 30)]
    assert seen == [7, 14, 15, 40], f"the drafter held {seen} tokens after pieces of 7, 7, 1 and 30 (the last one capped)"
    cache_whole, cache_pieces = whole.states[seq_whole.id].cache, pieces.states[seq_pieces.id].cache
    assert cache_whole.lengths == cache_pieces.lengths == [40]
    for layer in range(len(cache_whole.keys)):
        assert torch.equal(cache_whole.keys[layer][:, :, :40], cache_pieces.keys[layer][:, :, :40]), f"layer {layer} keys"
        assert torch.equal(cache_whole.values[layer][:, :, :40], cache_pieces.values[layer][:, :, :40]), f"layer {layer}"
    assert whole.propose(seq_whole, 4).tokens == pieces.propose(seq_pieces, 4).tokens


def test_the_hybrid_feeds_its_model_in_pieces_and_starts_its_matcher(drafter_model, target):
    model = DraftModelProposer(drafter_model, VOCAB)
    hybrid = HybridProposer(SuffixProposer(2, SuffixCorpus(None, VOCAB)), model)
    seq = Sequence((tokens(5, seed=2) * 4)[:20], SamplingParams(max_tokens=8))
    assert hybrid.prefill_batch([seq], [6]) == [6]
    assert model.states[seq.id].fed == 6
    assert hybrid.prefill_batch([seq], [50]) == [19]
    assert len(hybrid.propose(seq, 3).tokens) == 3, "the matcher, started beside the pieces, finds the repeat"


def test_a_long_prompts_drafter_starts_in_pieces_while_a_stream_runs(target, drafter_model):
    """A stream decodes with its drafter running; a 60-token prompt comes in. Its drafter is fed in pieces
    of at most the budget, never whole, the stream gets a token every step meanwhile, the late request
    drafts once its drafter has caught up, and both texts are the plain engine's."""
    chunk = 8
    proposer = Recording(drafter_model, VOCAB)
    config = SchedulerConfig(max_batch=2, k=3, adaptive_k=False, prefill_chunk=chunk)
    scheduler = Scheduler(target, proposer, config)
    stream_prompt, late_prompt = tokens(4, seed=1), tokens(60, seed=2)
    stream_params = SamplingParams(max_tokens=70, ignore_eos=True)
    late_params = SamplingParams(max_tokens=30, ignore_eos=True)
    events = stream_then_late(scheduler, (stream_prompt, stream_params), (late_prompt, late_params),
                              wait_for=("stream", "late"))
    results = {name: next(e for e in events[name] if isinstance(e, (Finished, Failed))) for name in events}
    assert all(isinstance(r, Finished) for r in results.values()), results
    assert proposer.whole == [4], f"whole drafter starts of {proposer.whole} tokens: only the stream's 4 should be"
    fed = [n for call in proposer.pieces for n in call]
    assert fed and max(fed) <= chunk, f"drafter pieces of {fed} tokens, over the budget of {chunk}"
    assert sum(fed) >= 60 - chunk, f"the pieces fed {sum(fed)} of the late prompt's tokens"
    late = results["late"].result
    assert late.stats.drafted > 0, "the late request never drafted after its drafter caught up"
    engine = Engine(target)
    assert results["stream"].result.token_ids == engine.generate(stream_prompt, stream_params).token_ids
    assert late.token_ids == engine.generate(late_prompt, late_params).token_ids


def test_seeded_rejection_sampled_requests_start_their_drafter_whole(target, drafter_model):
    """Their drafts, hence their output, must not depend on the load: no pieces for them."""
    proposer = Recording(drafter_model, VOCAB)
    scheduler = Scheduler(target, proposer, SchedulerConfig(max_batch=2, k=3, adaptive_k=False, prefill_chunk=4))
    params = SamplingParams(max_tokens=6, temperature=0.8, seed=3, coupling="rejection", ignore_eos=True)
    run_scheduler(scheduler, [(tokens(30, seed=4), params)])
    assert proposer.pieces == [] and proposer.whole == [30], (proposer.whole, proposer.pieces)
