"""The planner's cost model and plan: measured costs, acceptance by draft position, the probe timer.

Unit tests on hand-set costs and odds; the drivers that ask the planner for K
are tested in test_step.py (engine and scheduler) and test_server.py (the
scheduler's choices under a slow verifier).
"""

from __future__ import annotations

import statistics

import pytest

from augury.planner import DraftOdds, DraftTally, Planner, ProbeTimer, ShapeCosts, StepCosts
from augury.step_rate import plan_step, verify_time


def _odds(alpha: float, n: int) -> list[DraftOdds]:
    return [DraftOdds.independent(alpha, 8)] * n


def test_expected_tokens_counts_the_extra_token():
    assert DraftOdds.independent(0.0, 4).tokens(4) == 1.0
    assert DraftOdds.independent(1.0, 4).tokens(4) == 5.0
    assert DraftOdds.independent(0.5, 4).tokens(2) == pytest.approx(1.75)
    stopping = DraftOdds.independent(1.0, 4, continue_rate=0.5)
    assert stopping.tokens(3) == pytest.approx(1 + 1 + 0.5 + 0.25) and stopping.drafted(3) == pytest.approx(1.75)


def test_tally_measures_reach_and_acceptance_per_position():
    """Correlated acceptance: drafts either hold all the way or fail at once. The tally's odds see
    that (accepting 3 of 3 is as likely as 1 of 1), where one independent rate would not."""
    tally = DraftTally(4)
    for step in range(400):
        tally.record_draft(4, 3)  # a confident drafter allowed 4 stops after 3
        tally.record_verified(3 if step % 2 else 0)
    odds = tally.odds()
    assert odds.reach[:3] == pytest.approx([1.0] * 3) and odds.reach[3] == pytest.approx(4 / 404)
    assert odds.accept[:3] == pytest.approx([0.5] * 3, abs=0.01)
    assert odds.tokens(4) == pytest.approx(1 + 3 * 0.5, abs=0.03)
    assert odds.drafted(4) == pytest.approx(3.0, abs=0.02)


def test_tally_prior_continues_the_measured_chain_at_unmeasured_positions():
    """Drafts so far were capped at 2: positions 3 and 4 have no data. Their prior follows the
    conditional acceptance measured along the chain (0.8, then 0.9 of those), not alpha^(i+1),
    so a planner looking at them is not scared off long drafts it never tried."""
    tally = DraftTally(4)
    for step in range(1000):
        tally.record_draft(2, 2)
        tally.record_verified(2 if step % 10 < 7 else (1 if step % 10 < 8 else 0))
    accept = tally.odds().accept
    assert accept[0] == pytest.approx(0.8, abs=0.01) and accept[1] == pytest.approx(0.7, abs=0.01)
    ratio = accept[1] / accept[0]
    assert accept[2] == pytest.approx(accept[1] * ratio, rel=1e-6)
    assert accept[3] == pytest.approx(accept[2] * ratio, rel=1e-6)
    assert accept[3] > DraftTally.PRIOR_ALPHA**4 + 0.2


def _probe_steps(timer: ProbeTimer, plans: list[int]) -> list[int]:
    """The steps at which the timer probes, given the plan in force at each step (step i + 1)."""
    return [step for step, k in enumerate(plans, 1) if timer.due(step, k)]


def test_probes_grow_rarer_while_the_plan_holds_and_return_when_it_changes():
    """A steady plan doubles the interval up to 8x (a probe away from the best K costs speed);
    a plan found changed at a probe brings the interval back, so drift is followed again."""
    # The first probe finds no earlier plan; after it the gaps go 4, 8, 16, then 32 (8x) at most.
    assert _probe_steps(ProbeTimer(4), [2] * 100) == [4, 8, 16, 32, 64, 96]
    # The plan changes from 2 to 3 at step 61: the probe at 64 sees it and the gaps start again from 4.
    assert _probe_steps(ProbeTimer(4), [2] * 60 + [3] * 40) == [4, 8, 16, 32, 64, 68, 76, 92]
    assert _probe_steps(ProbeTimer(0), [2] * 100) == []


def _costs(per_row_token: float, base: float = 0.010) -> StepCosts:
    costs = StepCosts()
    for rows in (1, 2, 4, 8, 16):
        for block in (1, 2, 3, 5):
            costs.observe_target(rows, block, base + per_row_token * rows * block)
    return costs


def test_plan_drafts_fully_when_verification_is_free():
    ks = plan_step(_costs(0.0), _odds(0.8, 4), caps=[10] * 4, fixed=[None] * 4, k_max=4)
    assert ks == [4] * 4


def test_plan_stops_drafting_when_a_big_batch_makes_verification_expensive():
    """16 rows, each drafted token costs as much target time as a whole small step: plain wins."""
    costs = _costs(0.010)
    assert plan_step(costs, _odds(0.6, 16), [10] * 16, [None] * 16, k_max=4) == [0] * 16
    # The same costs with one sequence: verification is cheap relative to the base, drafting pays.
    assert plan_step(_costs(0.0005), _odds(0.9, 1), [10], [None], k_max=4) == [4]


def test_plan_uses_acceptance_and_drafting_cost():
    costs = _costs(0.0)
    costs.observe_draft(1, 4, 4 * 0.001)  # drafting a token costs a tenth of a (free-to-verify) target step
    # Plain: 2 tokens / 10 ms. alpha 0.05 gains ~0.05 tokens per 1 ms drafted token: a loss.
    assert plan_step(costs, _odds(0.05, 2), [10] * 2, [None] * 2, k_max=4) == [0, 0]
    assert plan_step(costs, _odds(0.99, 2), [10] * 2, [None] * 2, k_max=4) == [4, 4]  # 9.8 tokens / 18 ms
    middle = plan_step(costs, _odds(0.5, 2), [10] * 2, [None] * 2, k_max=4)  # K=1: 3 / 12 ms beats K=4: 3.9 / 18 ms
    assert middle[0] == middle[1] and 0 < middle[0] < 4
    costs = _costs(0.0)
    costs.observe_draft(1, 4, 4 * 0.008)  # drafting a token costs 80% of a step: never worth it
    assert plan_step(costs, _odds(0.99, 2), [10] * 2, [None] * 2, k_max=4) == [0, 0]


def test_plan_counts_batched_drafting_rounds_not_tokens():
    """8 sequences, one drafting round costs 6 ms whatever the rows: batched drafting pays (4 rounds
    for 8 drafts), drafting one sequence at a time (32 rounds) does not."""
    costs = _costs(0.0002, base=0.050)
    for rows in (1, 8):
        costs.observe_draft(rows, 4, 4 * 0.006)
    assert plan_step(costs, _odds(0.8, 8), [10] * 8, [None] * 8, k_max=4, batched=False) == [0] * 8
    assert plan_step(costs, _odds(0.8, 8), [10] * 8, [None] * 8, k_max=4, batched=True) == [4] * 8


def test_plan_drafts_long_when_acceptance_is_correlated():
    """Measured odds where drafts hold or fail as a whole make K=4 the best plan; one independent
    rate with the same single-token acceptance (0.6) would stop at K=1."""
    costs = _costs(0.0, base=0.095)
    costs.observe_draft(1, 4, 4 * 0.029)
    correlated = DraftOdds(reach=(1.0,) * 4, accept=(0.6, 0.58, 0.56, 0.55))
    assert plan_step(costs, [correlated], [10], [None], k_max=4) == [4]
    assert plan_step(costs, _odds(0.6, 1), [10], [None], k_max=4) == [1]


def test_plan_limited_to_given_choices():
    """Drafting a token costs a quarter of a step and acceptance decays: K = 2 is best overall, but a
    sequence alone only chooses between plain and K_max, and K = 4 still beats plain (14.4 vs 12.5/s)."""
    costs = StepCosts()
    for block in (1, 2, 3, 4, 5):
        costs.observe_target(1, block, 0.080)
    costs.observe_draft(1, 4, 4 * 0.020)
    odds = [DraftOdds.independent(0.6, 4)]
    assert plan_step(costs, odds, caps=[10], fixed=[None], k_max=4) == [2]
    assert plan_step(costs, odds, caps=[10], fixed=[None], k_max=4, choices=(0, 4)) == [4]
    costs.observe_draft(1, 4, 4 * 0.060)  # now drafting loses at every K: plain
    costs.observe_draft(1, 4, 4 * 0.060)
    costs.observe_draft(1, 4, 4 * 0.060)
    assert plan_step(costs, odds, caps=[10], fixed=[None], k_max=4, choices=(0, 4)) == [0]


def test_plan_respects_caps_and_fixed_lengths():
    ks = plan_step(_costs(0.0), _odds(0.9, 3), caps=[0, 2, 10], fixed=[None, None, 3], k_max=4)
    assert ks == [0, 2, 3]


def test_a_hiccup_does_not_move_a_measured_shape():
    """One step in five taking 3x as long (another process took a core) leaves the estimate alone."""
    costs = StepCosts()
    for seconds in (0.10, 0.10, 0.30, 0.10, 0.10, 0.10, 0.10):
        costs.observe_target(1, 5, seconds)
    assert costs.target_time(1, 5) == pytest.approx(0.10)
    for seconds in (0.20, 0.20, 0.20):  # a lasting change is followed within a few samples
        costs.observe_target(1, 5, seconds)
    assert costs.target_time(1, 5) == pytest.approx(0.20)


def test_unmeasured_shapes_come_from_the_fitted_line():
    costs = StepCosts()
    costs.observe_target(1, 5, 0.015)
    assert costs.target_time(4, 5) == pytest.approx(0.015)  # one size seen: flat (optimistic)
    costs.observe_target(2, 5, 0.020)
    assert costs.target_time(4, 5) == pytest.approx(0.030, rel=1e-6)  # 0.010 + 0.001 * rows * block


def test_the_planner_starts_from_the_measured_cost_curve():
    """A profile's curve (forward ms by new tokens) is the planner's prior before it measured anything:
    with verification that costs 3x one token at 5 tokens, a sequence alone is not drafted for at
    a middling acceptance; with a flat curve it is."""
    odds = [DraftOdds.independent(0.5, 4)]
    steep = Planner(4, batched=False, curve={1: 30.0, 2: 40.0, 4: 70.0, 5: 90.0})
    flat = Planner(4, batched=False, curve={1: 30.0, 2: 30.5, 4: 31.0, 5: 31.5})
    for planner in (steep, flat):
        planner.costs.observe_draft(1, 4, 4 * 0.003)
    assert plan_step(steep.costs, odds, [10], [None], 4, choices=(0, 4)) == [0]
    assert plan_step(flat.costs, odds, [10], [None], 4, choices=(0, 4)) == [4]


class _Alone:
    """What the planner reads of a request: a sequence alone, its drafter not started yet."""

    def __init__(self, behind: int) -> None:
        from augury.metrics import SpecStats
        from augury.sampling import SamplingParams

        from augury.proposers.base import Sequence

        self.params = SamplingParams(max_tokens=128)
        self.seq = Sequence([1, 2, 3], self.params)
        self.stats = SpecStats()
        self.started = False
        self.done = False
        self.behind = behind
        self.planned_drafted = self.planned_accepted = 0

    def draft_cap(self) -> int:
        return 100

    def catch_up(self) -> int:
        return self.behind


@pytest.mark.parametrize("behind, generated, starts", [(20, 0, True), (140, 0, False), (140, 90, True),
                                                      (2000, 90, False)])
def test_a_probe_starts_a_drafter_only_where_its_catch_up_is_cheap(behind, generated, starts):
    """Past the warm-up, a probe of a sequence alone starts its drafter for a 20-token catch-up (40 ms,
    about one plain step) at once. A 140-token one (0.28 s) waits: with nothing generated the plan
    spreads a catch-up over 8 tokens (`_catch_up_spread`), and 0.28 s is more than 4 plain steps;
    90 tokens in (of a request that may still generate 101), it spreads it over 98 tokens, 0.28 s is
    under a tenth of their plain time (0.29 s), and the probe starts it. A 2000-token prompt (4 s) never: a probe
    cannot win that back. The probe tries the K next to the plan's (0): 1."""
    planner = Planner(4, batched=False, probe_every=1, curve={1: 30.0, 5: 36.0})
    planner.steps = planner.k_max + 1  # the warm-up is over
    planner.costs.observe_catch_up(100, 0.2)  # 2 ms a token, as measured when a drafter started
    request = _Alone(behind)
    request.seq.tokens.extend([5] * generated)
    assert planner.plan([request]) == ([1] if starts else [0])
    assert planner.probes == 1  # it was a probe in every case


class _Drafted(_Alone):
    """A request whose drafter runs and has drafted: what `Planner.trim` and `observe_step` read too."""

    def __init__(self, draft, seq_id: int) -> None:
        from augury.proposers.base import Sequence

        super().__init__(0)
        self.seq = Sequence([1, 2, 3], self.params, id=seq_id)  # the id the planner keys its counts by
        self.draft = draft
        self.started = True


def _verify(planner: Planner, request: _Drafted, accepted: int, curve: dict[int, float]) -> int:
    """Trim the request's draft, then report a step that accepted `accepted` of what was kept; returns
    the kept length."""
    from augury.step import StepReport
    from augury.verify import VerifyResult

    planner.trim([request])
    kept = len(request.draft)
    result = VerifyResult(kept, min(accepted, kept), [0] * (min(accepted, kept) + 1))
    planner.observe_step(StepReport([result], [[]], {}, kept + 1, 0.0, curve[kept + 1] / 1e3), [request])
    return kept


def test_trim_verifies_each_kind_of_draft_by_its_own_acceptance():
    """A matcher's drafts from long matches (bucket 5) are always right, from one-token matches (bucket 1)
    never. Measured apart, the long ones soon keep all 4 tokens and the short ones are cut to nothing, but
    for a probe now and then (once after 16 skipped drafts, then after 32: `ProbeTimer`). One tally over
    both (bucket 0 for all) would price every draft at their mean and keep or cut them alike."""
    from augury.proposers.base import Draft

    curve = {1: 30.0, 2: 36.0, 3: 42.0, 4: 48.0, 5: 54.0}  # each verified token costs a fifth of a step
    planner = Planner(4, batched=False, curve=curve, free_drafts=True)
    kept = {5: [], 1: []}
    for i in range(120):
        for bucket, right in ((5, 4), (1, 0)):
            kept[bucket].append(_verify(planner, _Drafted(Draft([7, 7, 7, 7], bucket=bucket), i), right, curve))
    assert kept[5][4:] == [4] * 116  # the first under the bucket's prior (0.7, then a falling chain)
    late_short = kept[1][20:]
    assert late_short.count(0) >= len(late_short) - 3 and 1 <= len(late_short) - late_short.count(0)
    assert planner.by_bucket[5].accepted[3] == sum(k == 4 for k in kept[5]) and planner.by_bucket[1].accepted[0] == 0
    # A model's draft (bucket 0) keeps the length its drafter chose, however its kind fared.
    assert all(_verify(planner, _Drafted(Draft([7, 7, 7, 7]), 500 + i), 0, curve) == 4 for i in range(40))


def test_free_drafts_are_always_made_and_left_to_trim():
    """Past the warm-up, with verification steep and nothing ever accepted, a planner whose proposer drafts
    at no cost still asks for all K (drafting costs nothing; `trim` decides what is verified); one whose
    proposer runs a model plans plain steps."""
    curve = {1: 30.0, 2: 60.0, 3: 90.0, 4: 120.0, 5: 150.0}
    plans = {}
    for free in (False, True):
        planner = Planner(4, batched=False, curve=curve, free_drafts=free)
        planner.costs.observe_draft(1, 4, 4 * 0.003)
        for _ in range(200):
            planner.record_draft(4, 4)
            planner.record_verified(4, 0)
        planner.steps = planner.k_max + 2  # past the warm-up, between probes
        plans[free] = planner.plan([_Alone(0)])
    assert plans == {False: [0], True: [4]}


def test_a_free_draft_the_plan_did_not_ask_for_stays_out_of_the_plans_tally():
    """A hybrid's matcher draft on a plain step (`step.draft_free`) is verified and measured in its bucket,
    but says nothing of what asking the proposer for K delivers."""
    from augury.proposers.base import Draft
    from augury.step import DraftRound

    curve = {1: 30.0, 2: 30.1, 3: 30.2, 4: 30.3, 5: 30.4}
    planner = Planner(4, batched=False, curve=curve)
    request = _Drafted(Draft([7, 7, 7], bucket=3), 1)
    planner.observe_draft([request], [0], DraftRound(0, 0, 0.0, True, 0, 0.0))
    assert _verify(planner, request, 3, curve) == 3
    assert planner.tally.drafted == [0, 0, 0, 0] and planner.drafted == 0
    assert planner.by_bucket[3].accepted == [1, 1, 1, 0]


def test_a_sunk_draft_is_priced_by_verification_alone():
    """Drafting a token costs 30% of a step and verification is free: not worth drafting (K = 0), but once
    the draft is made (drafted=True) all of it is worth verifying."""
    costs = _costs(0.0)
    costs.observe_draft(1, 4, 4 * 0.003)
    odds = _odds(0.2, 1)  # a fifth of drafts accepted
    assert plan_step(costs, odds, [4], [None], 4) == [0]
    assert plan_step(costs, odds, [4], [None], 4, drafted=True) == [4]


def test_the_plans_tally_and_draft_costs_weigh_only_what_a_model_drafted():
    """For a hybrid, K > 0 buys the model's drafts (its matcher's come free either way): a matcher draft
    on a planned step and a round that ran no model leave the plan's tally and the drafting cost alone;
    a model's draft (bucket 0) and its round are counted."""
    from augury.proposers.base import Draft
    from augury.step import DraftRound

    curve = {1: 30.0, 2: 30.1, 3: 30.2, 4: 30.3, 5: 30.4}
    planner = Planner(4, batched=False, curve=curve)
    matched = _Drafted(Draft([7, 7], bucket=4), 1)
    planner.observe_draft([matched], [4], DraftRound(1, 2, 0.0001, True, 0, 0.0, forwards=0))
    _verify(planner, matched, 2, curve)
    assert planner.tally.drafted == [0, 0, 0, 0] and planner.costs.draft.recent == {}
    modelled = _Drafted(Draft([7, 7, 7]), 2)
    planner.observe_draft([modelled], [4], DraftRound(1, 3, 0.009, True, 0, 0.0, forwards=3))
    _verify(planner, modelled, 1, curve)
    assert planner.tally.drafted == [1, 1, 1, 0] and planner.tally.accepted == [1, 0, 0, 0]
    assert planner.costs.draft_round_time(1) == pytest.approx(0.003)



def test_a_drafters_catch_up_is_spread_over_how_long_outputs_run():
    """Recent outputs ran 16 tokens: a request 4 tokens in is expected to generate 12 more, not the 124
    its max_tokens allows, so a drafter whose catch-up costs 40 plain steps is not started for it (spread
    over 124 tokens it paid), while one 2 tokens behind still is. A request longer than every output seen
    is expected to run to its cap."""
    from augury.step_costs import OutputLengths

    lengths = OutputLengths()
    assert lengths.expected_left(4, 124) == 124  # nothing finished yet
    for n in (16, 16, 16, 16):
        lengths.observe(n)
    assert lengths.expected_left(4, 124) == 12 and lengths.expected_left(20, 100) == 100
    curve = {1: 30.0, 2: 30.3, 3: 30.6, 4: 30.9, 5: 31.2}
    planner = Planner(4, batched=False, curve=curve)
    planner.costs.observe_catch_up(100, 100 * 0.012)  # 12 ms a token: 100 tokens are 40 plain steps
    planner.costs.observe_draft(1, 4, 4 * 0.001)
    odds = [DraftOdds.independent(0.8, 4)]
    args = dict(batched=False, behind=[100], choices=(0, 4))
    assert plan_step(planner.costs, odds, [123], [None], 4, **args) == [4]
    assert plan_step(planner.costs, odds, [123], [None], 4, left=[12.0], **args) == [0]
    assert plan_step(planner.costs, odds, [123], [None], 4, left=[12.0], batched=False, behind=[2],
                     choices=(0, 4)) == [4]


def test_a_catch_up_is_priced_as_one_drafter_forward_plus_a_rate_per_token():
    """A warm-up started its drafter on 1 token in 16 ms, one drafter forward (a drafting round takes
    16 ms): that says nothing of a per-token rate, so a 52-token catch-up is priced one forward, not 52
    of them (0.83 s: at that price the 0.5B was never started for a 52-token prompt). A 52-token catch-up
    measured at 115 ms then sets the rate, (115 - 16) ms over the tokens seen, and a 741-token one is
    priced one forward plus 741 of those."""
    from augury.step_costs import StepCosts

    costs = StepCosts()
    assert costs.catch_up_time(52) == 0.0  # nothing measured: free, so the planner tries
    costs.observe_catch_up(1, 0.016)  # before any drafting round was measured, as a start comes first
    costs.observe_draft(1, 4, 4 * 0.016)
    assert costs.catch_up_time(52) == pytest.approx(0.016)
    assert costs.catch_up_time(0) == 0.0
    costs.observe_catch_up(52, 0.115)
    rate = (0.115 - 0.016) / (52 + (1 - StepCosts.CATCH_UP_SMOOTHING) * 1)
    assert costs.catch_up_time(741) == pytest.approx(0.016 + 741 * rate)
    assert 1.3 < costs.catch_up_time(741) < 1.5


def test_a_catch_up_of_a_few_steps_is_not_capped():
    """A 50-token catch-up at one 12 ms drafter forward plus 2 ms a token (112 ms) is under
    CHEAP_CATCH_UP_STEPS (8) plain steps (240 ms): spread over the 101 tokens the request may generate it pays at once (K > 0), where spread
    over the 8 tokens the cap allows at the first token it would not (drafting rounds of 12 ms, 3 of 4
    drafted tokens accepted). An 84-token prompt's catch-up of about 5 steps under the cap started the
    0.5B 17 tokens into its answer (docs/benchmarks.md 33d, 34a)."""
    planner = Planner(4, batched=False, probe_every=0, curve={1: 30.0, 2: 31.0, 3: 32.0, 4: 33.0, 5: 34.0})
    planner.steps = planner.k_max + 1  # the warm-up is over
    planner.costs.observe_draft(1, 4, 4 * 0.012)
    planner.costs.observe_catch_up(100, 0.012 + 0.2)
    for _ in range(20):
        planner.record_draft(4, 4)
        planner.record_verified(4, 3)
    request = _Alone(50)
    assert planner.costs.catch_up_time(50) == pytest.approx(0.112)
    assert not planner._catch_up_is_dear(request)
    assert planner._catch_up_spread(request, dear=False) == 101
    [k] = planner.plan([request])
    assert k > 0
    assert plan_step(planner.costs, [planner.tally.odds()], [100], [None], 4, behind=[50], left=[8.0]) == [0]


@pytest.mark.parametrize("behind, generated, starts", [(20, 0, True), (500, 0, False), (500, 40, False),
                                                      (500, 60, True)])
def test_a_long_catch_up_waits_until_the_request_has_run_long_enough_to_pay_for_it(behind, generated, starts):
    """Nothing finished yet, so a request may run to its cap (101 tokens): spread over all of them, a
    500-token catch-up (1 s at 2 ms a token, 33 plain steps) pays at once. Spread over no more than the
    tokens the request has generated plus 8, it waits: not at 0 or 40 tokens, drafting from 60 (where
    the drafts, 3 of 4 tokens accepted at 4 ms a token, win back 1 s over 68 tokens). A 20-token
    catch-up (40 ms) starts at once."""
    planner = Planner(4, batched=False, probe_every=0, curve={1: 30.0, 2: 31.0, 3: 32.0, 4: 33.0, 5: 34.0})
    planner.steps = planner.k_max + 1  # the warm-up is over
    planner.costs.observe_catch_up(100, 0.2)
    planner.costs.observe_draft(1, 4, 4 * 0.004)
    for _ in range(20):
        planner.record_draft(4, 4)
        planner.record_verified(4, 3)
    request = _Alone(behind)
    request.seq.tokens.extend([5] * generated)
    assert len(request.seq.output) == generated
    [k] = planner.plan([request])
    assert (k > 0) == starts, f"K {k} for a {behind}-token catch-up {generated} tokens in"


@pytest.mark.parametrize("planned, plan", [((0, 0), [0]), ((100, 100), [4])])
def test_a_requests_own_acceptance_counts_only_the_drafts_the_plan_bought(planned, plan):
    """The model drafts poorly (all or nothing, all 0.3 of the time) and verification is steep (5 tokens
    cost 2x one): no draft pays. A request whose matcher drafts were all accepted (a RAG answer copying its
    prompt: stats say 100 of 100) is planned plain all the same, since those drafts say nothing of the
    model; one whose model drafts (the plan's) were all accepted is drafted for."""
    curve = {1: 30.0, 2: 37.5, 3: 45.0, 4: 52.5, 5: 60.0}
    planner = Planner(4, batched=False, curve=curve)
    planner.costs.observe_draft(1, 4, 4 * 0.003)
    for i in range(200):
        planner.record_draft(4, 4)
        planner.record_verified(4, 4 if i % 10 < 3 else 0)
    planner.steps = planner.k_max + 2  # past the warm-up, between probes
    request = _Alone(0)
    request.started = True
    request.stats.drafted = request.stats.accepted = 100
    request.planned_drafted, request.planned_accepted = planned
    assert planner.plan([request]) == plan


def _alone_planner(curve: dict[int, float], round_ms: float) -> Planner:
    """A planner past its warm-up that never probes, its drafter measured at round_ms a drafting round."""
    planner = Planner(4, batched=False, probe_every=0, curve=curve)
    planner.steps = planner.k_max + 1
    planner.costs.observe_draft(1, 4, 4 * round_ms / 1e3)
    return planner


def test_a_sequence_alone_drafts_short_where_verification_is_steep():
    """A drafter at 15 ms a round and the prior's acceptance (0.7, chained): on a cost curve where two
    tokens cost what one does but five cost twice as much (Zen 2's, docs/benchmarks.md 28), one drafted
    token pays (1.7 tokens in 66 ms against 1 in 50) and four do not (2.8 in 158 ms); where
    verification is flat, four do."""
    steep = {1: 49.7, 2: 51.2, 3: 68.3, 4: 83.8, 5: 97.5}
    flat = {1: 30.0, 2: 30.5, 3: 31.0, 4: 31.5, 5: 32.0}
    request = _Alone(0)
    request.started = True
    assert _alone_planner(steep, 15.0).plan([request]) == [1]
    assert _alone_planner(flat, 3.0).plan([request]) == [4]
    assert _alone_planner(steep, 60.0).plan([request]) == [0]  # a drafter as dear as a step: plain


def test_verification_is_priced_at_the_length_a_doubting_drafter_drafts():
    """A drafter allowed four tokens that stops after the first 70% of the time: its forward costs what
    the drafted lengths cost on average, so allowing four (2.71 tokens in ~75 ms) beats allowing one
    (1.9 in 57 ms); priced at five rows (98 ms) it would not (25 tokens/s against 33)."""
    costs = StepCosts()
    for block, ms in {1: 50.0, 2: 52.0, 3: 68.0, 4: 84.0, 5: 98.0}.items():
        for _ in range(3):  # seen enough times to be read as measured, not from the fitted line
            costs.observe_target(1, block, ms / 1e3)
    costs.observe_draft(1, 4, 4 * 0.005)
    odds = DraftOdds(reach=(1.0, 0.3, 0.3, 0.3), accept=(0.9, 0.9, 0.9, 0.9))
    assert verify_time(costs, [odds], [4]) == pytest.approx((50 + 2 + 0.3 * (16 + 16 + 14)) / 1e3)
    assert verify_time(costs, [odds], [0]) == pytest.approx(0.050)
    assert verify_time(costs, [odds, odds], [4, 1]) == pytest.approx(costs.target_time(2, 5))  # its widest draft
    assert verify_time(costs, [odds], [4], drafted=True) == pytest.approx(0.098)  # a made draft: its length
    assert plan_step(costs, [odds], [10], [None], k_max=4) == [4]


def test_a_cost_curves_points_are_read_as_measured_until_the_run_measures_them():
    """Zen 2's curve (1 token 49.7 ms, 2 tokens 51.2, then steep): read through a line, a plain step came
    out at 38.6 ms; each point is its own value until this run's steps of that shape replace it."""
    curve = {1: 49.7, 2: 51.2, 3: 68.3, 4: 83.8, 5: 97.5}
    planner = Planner(4, batched=False, curve=curve)
    assert [planner.costs.target_time(1, t) for t in curve] == pytest.approx([ms / 1e3 for ms in curve.values()])
    for _ in range(5):
        planner.costs.observe_target(1, 1, 0.060)
    assert planner.costs.target_time(1, 1) == pytest.approx(0.060)


def test_a_stale_curve_is_scaled_by_what_the_run_measured():
    """A quick curve saved in a slow spell (1 token 63.6 ms ... 5 tokens 78.9) while this run's steps are
    0.64x as dear: once the run has measured the 5-token verification, the plain step it has not run is
    priced at the same ratio, not at the stale 63.6 ms beside a fresh 50.5 ms verification (which made
    every draft look like a 1.26x gain, docs/benchmarks.md 37a); the shapes' ratios stay the curve's."""
    curve = {1: 63.6, 2: 66.0, 3: 70.1, 4: 74.7, 5: 78.9}
    planner = Planner(4, batched=False, curve=curve)
    for _ in range(ShapeCosts.MIN_SAMPLES):
        planner.costs.observe_target(1, 5, 0.0789 * 0.64)
    assert planner.costs.target_time(1, 5) == pytest.approx(0.0789 * 0.64)
    assert [planner.costs.target_time(1, t) for t in (1, 2, 3, 4)] == pytest.approx(
        [curve[t] * 0.64 / 1e3 for t in (1, 2, 3, 4)])
    for _ in range(ShapeCosts.MIN_SAMPLES):  # the run's own plain steps then stand for themselves
        planner.costs.observe_target(1, 1, 0.0415)
    assert planner.costs.target_time(1, 1) == pytest.approx(0.0415)
    assert planner.costs.target_time(1, 2) == pytest.approx(0.066 * statistics.median([0.64, 41.5 / 63.6]))


def test_a_drafter_priced_out_in_a_slow_spell_is_measured_again():
    """The drafter's first start (60 tokens in 0.9 s) and rounds (40 ms) were measured in a slow spell:
    at that price a probe does not start it for a 40-token catch-up (0.61 s, 20 plain steps), and no
    plan does, so nothing would ever measure it again. After REMEASURE_AFTER requests finished without
    it, a probe starts it for a catch-up no longer than one paid before (not for a longer one), and what
    that start and its round measure replace the old prices instead of joining them."""
    from augury.step import DraftRound, StepReport
    from augury.verify import VerifyResult

    planner = Planner(4, batched=False, probe_every=1, curve={1: 30.0, 5: 36.0})
    planner.steps = planner.k_max + 1  # the warm-up is over
    planner.observe_draft([], [], DraftRound(1, 4, 4 * 0.040, True, 60, 0.9, forwards=4))
    short, long = _Alone(40), _Alone(100)
    assert planner.plan([short]) == [0]
    for _ in range(Planner.REMEASURE_AFTER):
        finished = _Alone(0)
        finished.done = True
        planner.observe_step(StepReport([VerifyResult(0, 0, [0])], [[]], {}, 1, 0.03, 0.03), [finished])
    planner.probe_timer = ProbeTimer(1)
    assert planner.plan([long]) == [0]  # longer than any start paid before
    planner.probe_timer = ProbeTimer(1)
    assert planner.plan([short]) == [1]
    assert planner.costs.catch_up_time(40) > 0.5  # the old prices stand until the new ones come
    planner.observe_draft([], [], DraftRound(1, 1, 0.013, True, 40, 0.1, forwards=1))
    assert planner.costs.draft_round_time(1) == pytest.approx(0.013)
    assert planner.costs.catch_up_time(40) == pytest.approx(0.1)


@pytest.mark.parametrize("free_accepted, drafts", [(0, True), (100, False)])
def test_a_hybrids_model_must_beat_its_matcher_before_a_dear_catch_up(free_accepted, drafts):
    """A 200-token catch-up (0.41 s, 14 plain steps of 30 ms) 100 tokens into a request: the model's drafts
    (the first token always accepted, all four a fifth of the time, 4 ms a token) win it back against plain
    decoding, so the plan starts the drafter where the request's free (matcher) drafts committed nothing.
    Where they committed a token more a step over its 100 steps (a summary copying its prompt), K = 0 is
    worth about 1.96 tokens a 30 ms step, and the catch-up is not paid. A request whose drafter runs (no
    catch-up) is planned against plain decoding: its matcher's good drafts are still taken at K > 0."""
    curve = {1: 30.0, 2: 30.2, 3: 30.4, 4: 30.6, 5: 30.8}
    planner = Planner(4, batched=False, probe_every=0, curve=curve)
    planner.steps = planner.k_max + 2  # past the warm-up, between probes
    planner.costs.observe_draft(1, 4, 4 * 0.004)
    planner.costs.observe_catch_up(100, 0.004 + 0.2)  # 2 ms a token beyond one forward
    for i in range(100):
        planner.record_draft(4, 4)
        planner.record_verified(4, 1 if i % 5 else 4)
    late, running = _Alone(200), _Alone(0)
    running.started = True
    for request in (late, running):
        request.seq.tokens.extend([5] * 100)
        request.stats.steps, request.stats.accepted = 100, free_accepted
    assert planner._catch_up_is_dear(late) and not planner._catch_up_is_dear(running)
    free = planner._free_tokens(late)
    assert free == pytest.approx(free_accepted / (100 + 4))
    [k] = planner.plan([late])
    assert (k > 0) == drafts, f"K {k}: free {free:.2f} a step, the model's K = 4 {planner.tally.odds().tokens(4):.2f}"
    [k] = planner.plan([running])
    assert k > 0
