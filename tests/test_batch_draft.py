"""The scheduler's drafting (batch_draft.BatchDrafter): a drafter that raises fails only the requests it
drafted for, and the server goes on serving."""

from __future__ import annotations

import pytest

from augury.engine import Engine
from augury.proposers.base import Draft, ProposerBase
from augury.sampling import SamplingParams
from augury.scheduler import Failed, Finished, Scheduler, SchedulerConfig
from tests.tiny import scheduler_events, tiny_model

VOCAB = 24
POISON = 9  # a prompt starting with this token makes the drafter raise


class Raising(ProposerBase):
    """Guesses the next tokens as last + 1, + 2, ...; raises for a sequence whose prompt starts with POISON,
    in its model drafts (propose) or in its free ones (propose_free)."""

    name = "raising"

    def __init__(self, where: str) -> None:
        self.where = where

    def _guess(self, seq, k: int, here: str) -> Draft:
        if seq.tokens[0] == POISON and self.where == here:
            raise RuntimeError(f"the drafter broke in {here}")
        return Draft([(seq.tokens[-1] + i) % VOCAB for i in range(1, k + 1)])

    def propose(self, seq, k: int) -> Draft:
        return self._guess(seq, k, "propose") if self.where == "propose" else Draft([])

    def propose_free(self, seq, k: int) -> Draft:
        return self._guess(seq, k, "propose_free")


@pytest.fixture(scope="module")
def target():
    return tiny_model(vocab=VOCAB, seed=3, hidden=32, layers=2)


@pytest.mark.parametrize("where,adaptive", [("propose", False), ("propose_free", True)])
def test_a_drafter_that_raises_fails_only_its_own_request(target, where, adaptive):
    """propose raises in a batch drafted alone per request (this proposer does not batch); propose_free
    (a hybrid's matcher, on plain-plan steps) raises for one request: that request gets an internal
    failure, the others beside it in the same steps finish with their plain text, and a later request
    is served."""
    params = SamplingParams(max_tokens=12, ignore_eos=True)
    prompts = [[1, 2, 3, 4], [POISON, 3, 4, 5], [7, 7, 8]]
    want = {i: Engine(target).generate(p, params).token_ids for i, p in enumerate(prompts)}
    scheduler = Scheduler(target, Raising(where), SchedulerConfig(max_batch=3, k=3, adaptive_k=adaptive))
    scheduler.start()
    try:
        events = scheduler_events(scheduler, [(p, params) for p in prompts])
        later = scheduler_events(scheduler, [([2, 3, 4], params)])[0]
    finally:
        scheduler.stop()
    failed = events[1]
    assert isinstance(failed, Failed) and "drafting" in failed.message, failed
    for i in (0, 2):
        assert isinstance(events[i], Finished), f"request {i} beside the broken one: {events[i]}"
        assert events[i].result.token_ids == want[i]
    assert isinstance(later, Finished) and later.result.token_ids == Engine(target).generate([2, 3, 4], params).token_ids
    assert scheduler.running == 0 and scheduler.stats.failed == 1
