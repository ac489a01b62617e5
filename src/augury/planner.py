"""How many tokens to draft per sequence and step, from measured costs and acceptance.

Verifying K drafted tokens is nearly free for one sequence, but a batch of
sequences can fill the hardware, and then every drafted token costs real
target time (plus the drafter's own). Before each step the planner picks the
common draft length K that maximizes expected tokens per second (the rate
and its terms: `step_rate.py`), from costs it measures (`StepCosts`) and
acceptance by draft position (`DraftTally`). A drafter's catch-up (its
prefill of the sequence) is paid at once where it costs a few plain steps;
a dearer one is spread over no more tokens than the request has generated
(plus a few), and for a hybrid must beat what its free matcher drafts
already commit: a drafter starts once the request has shown it pays.

K = 0 is plain decoding, so whenever drafting does not pay the planner stops
drafting. The first k_max + 1 steps try every K once; afterwards a probe
every `probe_every` steps tries a neighbour of the current choice, the
interval doubling while the plan holds. Seeded sampled requests always draft
the configured K.

Once drafted, `trim` cuts each draft to the length that pays by the acceptance
measured for its kind (`Draft.bucket`: a matcher's match length), pricing the
target's forward alone, as the drafting is spent. So drafters whose drafts
cost nothing (`drafts_free`) draft all they may every step, and the plan
itself weighs what K buys beyond them: a model's drafts. The planner only
decides lengths: `step.py` runs the step. What each constant was tuned on is
recorded in docs/design.md.
"""

from __future__ import annotations

import math

from augury.draft_odds import DraftOdds, DraftTally
from augury.request import Request
from augury.step import DraftRound, StepReport
from augury.step_costs import ShapeCosts, StepCosts
from augury.step_rate import plan_step, verify_time

__all__ = ["DraftOdds", "DraftTally", "Planner", "ProbeTimer", "ShapeCosts", "StepCosts", "plan_step"]


class ProbeTimer:
    """When to probe: every `every` steps at first, the interval doubling (up to
    8x) each time the plan is found unchanged at a probe, and reset to `every`
    when it changed. 0 never probes."""

    MAX_STRETCH = 8  # a probe away from the best K costs speed; 8x keeps one probe per ~128 steps at most

    def __init__(self, every: int) -> None:
        self.every = every
        self.gap = every
        self.next = every
        self.plan_at_last: int | None = None

    def due(self, step: int, planned_k: int) -> bool:
        """Whether step `step` probes (and if so, when the next one will)."""
        if not self.every or step < self.next:
            return False
        steady = planned_k == self.plan_at_last
        self.gap = min(2 * self.gap, self.MAX_STRETCH * self.every) if steady else self.every
        self.plan_at_last = planned_k
        self.next = step + self.gap
        return True


class Planner:
    """The scheduler's choice of K per step: warm-up, probes, and `plan_step` over measured costs."""

    # Drafting among several sequences must be predicted this much faster than
    # plain decoding: batched steps have more ways to go wrong (catch-ups,
    # drafter starts, uneven drafts) than the cost model sees.
    DRAFT_MARGIN = 0.15
    # Drafted tokens, server-wide, before the measured acceptance replaces the prior.
    TRUST_AFTER_DRAFTED = 32
    # The most a probe may spend starting a drafter: plain steps, or a share of the request's plain
    # time left, whichever is more (see _start_is_cheap).
    PROBE_START_STEPS = 4
    PROBE_START_SHARE = 0.1
    # A step that feeds prompt pieces holds rows enough for this share of the forward's best rows per
    # second (step_rows), and at least MIN_PROMPT_PIECE prompt tokens; UNMEASURED_PIECE before any two
    # forwards of different sizes were measured.
    PREFILL_EFFICIENCY = 0.9
    # A drafter's catch-up is spread over at most the tokens its request has generated so far plus these
    # (see _catch_up_spread).
    CATCH_UP_LOOKAHEAD = 8
    # A drafter's catch-up of at most this many plain steps is paid at once (see _catch_up_is_dear).
    CHEAP_CATCH_UP_STEPS = 8
    # A drafter that ran in none of this many finished requests is measured again (see _remeasure).
    REMEASURE_AFTER = 4
    MIN_PROMPT_PIECE = 8
    UNMEASURED_PIECE = 16

    def __init__(
        self,
        k_max: int,
        *,
        batched: bool,
        adaptive: bool = True,
        probe_every: int = 16,
        curve: dict[int, float] | None = None,
        free_drafts: bool = False,
    ) -> None:
        """curve: the target's measured forward milliseconds by new tokens for one sequence (`augury
        profile`, `costs.load_cost_curve`): a prior for the step costs before this run measured its own.
        free_drafts: the proposer's drafts cost no model forward (`Proposer.drafts_free`): every step
        drafts all it may, and `trim` alone decides what is verified."""
        self.k_max = k_max
        self.batched = batched
        self.adaptive = adaptive
        self.free_drafts = free_drafts
        self.tally = DraftTally(k_max)  # every verified draft: what asking for K delivers
        self.by_bucket: dict[int, DraftTally] = {}  # the same, per kind of draft (`Draft.bucket`)
        self.bucket_probes: dict[int, ProbeTimer] = {}  # when a bucket trimmed to nothing is verified anyway
        self.bucket_skips: dict[int, int] = {}  # drafts of each bucket trimmed to nothing so far
        self.verifying: dict[int, int] = {}  # sequence id -> the bucket of the draft its next step verifies
        self.planned: dict[int, int] = {}  # sequence id -> tokens the plan let its next step's draft have
        self.costs = StepCosts()
        for tokens, ms in sorted((curve or {}).items()):
            self.costs.observe_rows(tokens, ms / 1000.0)
            # A curve's point is a profile's median, a prior for that shape until this run has measured it
            # (scaled by what the run measured of the others): read from the line through all points, a
            # curve flat from 1 to 2 tokens and steep after put 2 tokens 22% below 1 (docs/benchmarks.md 28b).
            if tokens <= k_max + 1:
                self.costs.prior_target(1, tokens, ms / 1000.0)
        self.drafted = 0  # server-wide drafted and accepted tokens
        self.accepted = 0
        self.steps = 0
        self.probes = 0
        self.planned_k = 0  # the K the cost model chose last (probes try its neighbours)
        self.probe_timer = ProbeTimer(probe_every)
        self.idle_requests = 0  # requests finished since the drafter last ran (a drafting round or a start)

    # -- what the steps measured ------------------------------------------------------------

    def observe_draft(self, requests: list[Request], ks: list[int], measured: DraftRound) -> None:
        """What one `draft` call over `requests` (asked for `ks`) cost; what it delivered is counted when its
        step is observed, as long as `trim` left each draft."""
        for request, k in zip(requests, ks):
            allowed = min(k, request.draft_cap())
            # The plan's tally is what asking for K buys beyond the free drafts: a draft of bucket 0 (a
            # model's). A matcher's draft (a hybrid's, or one the plan did not ask for, `step.draft_free`)
            # is measured in its own bucket only, so that a hybrid's plan weighs its model alone.
            if allowed and request.draft.bucket == 0:
                self.planned[request.seq.id] = allowed
        if measured.started_tokens:
            self.costs.observe_catch_up(measured.started_tokens, measured.start_s)
        if measured.started_tokens or measured.forwards:
            self.idle_requests = 0
        if measured.rounds and measured.in_step and measured.forwards:  # a round that ran no model is free
            self.costs.observe_draft(measured.rows, measured.rounds, measured.seconds)

    def observe_step(self, report: StepReport, requests: list[Request], rest_s: float | None = None) -> None:
        """What one `step` over `requests` (in the step's order) verified, and what its target forward cost.
        rest_s: a server's whole step less its forward and its drafting (verifying, sampling, the streams'
        text, releases), priced by `StepBound` beside the forward (`StepCosts.rest`)."""
        if rest_s is not None and (decoded := sum(1 for result in report.results if result is not None)):
            self.costs.observe_rest(decoded, rest_s)
        for request, result in zip(requests, report.results):
            if result is None:
                continue
            if request.done:  # how long outputs run, for what a drafter's catch-up is spread over
                self.costs.lengths.observe(len(request.seq.output))
                self.idle_requests += 1
            allowed = self.planned.pop(request.seq.id, 0)
            if allowed:
                self.record_draft(allowed, result.num_drafted)
                self.record_verified(result.num_drafted, result.num_accepted)
                request.planned_drafted += result.num_drafted
                request.planned_accepted += result.num_accepted
            bucket = self.verifying.pop(request.seq.id, None)
            if bucket is not None and result.num_drafted:
                tally = self.by_bucket.setdefault(bucket, DraftTally(self.k_max))
                tally.record_draft(result.num_drafted, result.num_drafted)
                tally.record_verified(result.num_accepted)
        self.planned.clear()  # drafts of requests that left before their step (cancelled) are not kept
        self.verifying.clear()
        if report.rows:
            self.costs.observe_rows(report.rows, report.forward_s)
        if not report.prompt_rows:  # a step that fed prompt pieces says nothing of a decode step's cost
            self.costs.observe_target(len(report.results), report.width, report.seconds)

    def step_rows(self, limit: int) -> int:
        """The rows a step that feeds prompt pieces fills up to, at most `limit`: the fewest at which a
        forward reaches PREFILL_EFFICIENCY of its best rows per second, by the measured cost of a forward
        against its rows (t = a + b * rows, from the profile's curve and every step since):
        rows / (a + b * rows) >= e / b  <=>  rows >= e / (1 - e) * a / b.

        Fewer rows would prefill slower than the machine can (the fixed cost of
        reading the weights spread over too few rows); more would stretch the
        running streams' step for little more prefill speed.
        """
        fixed, per_row = self.costs.rows.line()
        if per_row <= 0.0:
            return min(limit, self.UNMEASURED_PIECE)
        e = self.PREFILL_EFFICIENCY
        return max(1, min(limit, math.ceil(e / (1.0 - e) * fixed / per_row - 1e-9)))

    def prompt_budget(self, decode_rows: int, limit: int) -> int:
        """Prompt tokens the next step may feed beside `decode_rows` decode rows (at most `limit`).

        Pieces ride in the decode rows' forward, so the running streams wait for
        them: the step is filled up to `step_rows`, and never below
        MIN_PROMPT_PIECE prompt tokens, so prompts keep entering under any load
        (prompts admitted faster than they are prefilled would wait without
        bound). With nothing decoding nobody waits: a prompt takes `limit`.
        """
        if decode_rows == 0:
            return limit
        return min(limit, max(self.MIN_PROMPT_PIECE, self.step_rows(limit) - decode_rows))

    def expected_gain(self, requests: list[Request], k: int | None = None) -> float:
        """Predicted tokens per second drafting k (default the current plan's) over plain decoding's, from the
        cost model and the measured acceptance."""
        if not requests or self.k_max == 0:
            return 1.0
        odds = [self.tally.odds().scaled(self._alpha(r) / max(self.alpha, 1e-3)) for r in requests]
        k = self.planned_k if k is None else k
        rows = len(requests)

        def rate(kr: int) -> float:
            tokens = sum(o.tokens(kr) for o in odds)
            draft_s = sum(o.drafted(kr) for o in odds) * self.costs.draft_round_time(1) if kr else 0.0
            return tokens / max(verify_time(self.costs, odds, [kr] * rows) + draft_s, 1e-9)

        return rate(k) / rate(0)

    def record_draft(self, allowed: int, drafted: int) -> None:
        self.tally.record_draft(allowed, drafted)

    def record_verified(self, drafted: int, accepted: int) -> None:
        self.drafted += drafted
        self.accepted += accepted
        self.tally.record_verified(accepted)

    @property
    def alpha(self) -> float:
        """Server-wide acceptance once enough was drafted, else the prior."""
        if self.drafted >= self.TRUST_AFTER_DRAFTED:
            return self.accepted / self.drafted
        return DraftTally.PRIOR_ALPHA

    def _alpha(self, request: Request) -> float:
        """A request's acceptance of the drafts the plan bought (a model's), shrunk towards the server's for
        requests with little history. Not its matcher drafts': a RAG answer that copies its prompt has
        them accepted, which said nothing of the model, and once counted it started a 0.5B on a
        741-token prompt for a 16-token answer (docs/benchmarks.md 20a)."""
        w = DraftTally.PRIOR_WEIGHT
        return (request.planned_accepted + w * self.alpha) / (request.planned_drafted + w)

    @staticmethod
    def _free_tokens(request: Request) -> float:
        """Tokens beyond one that a step of this request commits from free drafts (a hybrid's matcher): what
        its drafts that the plan did not buy committed, over all its steps (a step that verified a model's
        draft counts as none: there the matcher had little to offer), pulled towards 0 by
        DraftTally.PRIOR_WEIGHT steps' worth of doubt.

        For a hybrid, K = 0 is not plain decoding. Priced as if it were, a summary that copies its
        prompt (its matcher's drafts committing about one token more a step) started the 0.5B on a
        709-token prompt: 1.5 s of drafting, most of it the catch-up, for the tau the matcher had alone,
        1.23x plain against 1.78x (docs/benchmarks.md 34b). The plan weighs it only against a dear
        catch-up (`_catch_up_is_dear`): once started, a hybrid still takes its matcher's drafts where
        they are the better guess, so K > 0 forgoes little of them; and a cheap start is how the
        model's acceptance on this request gets measured at all (weighed against every step's free
        tokens, math prompts at T 0.7 never started the 0.5B, whose tau there is 2.2-3.3).
        """
        free = request.stats.accepted - request.planned_accepted
        return max(0, free) / (request.stats.steps + DraftTally.PRIOR_WEIGHT)

    # -- the plan ---------------------------------------------------------------------------

    def plan(self, requests: list[Request]) -> list[int]:
        """Draft length per running sequence for this step."""
        caps = [r.draft_cap() for r in requests]
        if self.k_max == 0:
            return [0] * len(requests)
        # Seeded requests sampled by rejection draft the configured K (their text depends on K);
        # coupled ones give the same text at any K, so the planner may choose theirs.
        fixed = [self.k_max if r.params.load_dependent else None for r in requests]
        self.steps += 1
        if not self.adaptive or self.free_drafts:  # free drafts: `trim` decides what is verified
            return [min(self.k_max, cap) for cap in caps]
        alone = len(requests) == 1
        # Every K, a sequence alone too: with verification priced at the length a drafter that stops
        # when it doubts really drafts (`verify_time`), a short cap is chosen only where the cost curve
        # is steep enough to pay for it (docs/design.md). Probes and plans both pick from these.
        candidates = tuple(range(self.k_max + 1))
        probe = None
        if self.steps <= self.k_max + 1:
            probe = self.k_max + 1 - self.steps  # warm-up: every K once
        elif self.probe_timer.due(self.steps, self.planned_k):
            # Next to the current choice, alternately below and above: enough to
            # follow the best K as costs and acceptance drift, and far cheaper
            # under load than trying the longest drafts when K = 0 is best.
            self.probes += 1
            lower = [k for k in candidates if k < self.planned_k]
            higher = [k for k in candidates if k > self.planned_k]
            neighbours = lower[-1:] + higher[:1]
            probe = neighbours[self.probes % len(neighbours)]
        if probe is not None:
            may_start = self.steps <= self.k_max + 1 or (
                alone and (self._start_is_cheap(requests[0]) or self._remeasure(requests[0])))
            return self._probe(requests, probe, caps, fixed, may_start=may_start)
        odds = self.tally.odds()
        dear = [self._catch_up_is_dear(r) for r in requests]
        ks = plan_step(
            self.costs, [odds.scaled(self._alpha(r) / max(self.alpha, 1e-3)) for r in requests], caps, fixed,
            self.k_max, batched=self.batched, behind=[r.catch_up() for r in requests],
            left=[self._catch_up_spread(r, d) for r, d in zip(requests, dear)],
            margin=0.0 if alone else self.DRAFT_MARGIN, choices=candidates,
            free=[self._free_tokens(r) if d else 0.0 for r, d in zip(requests, dear)],
        )
        self.planned_k = max((k for k, f in zip(ks, fixed) if f is None), default=self.planned_k)
        return ks

    def trim(self, requests: list[Request]) -> None:
        """Cut each request's draft to what is worth verifying, by the acceptance measured for its bucket.

        The drafts are made by now and their cost is spent; what is left to
        choose is the width of the target's forward, which the cost curve
        prices, against the tokens each draft's bucket is expected to commit
        (`plan_step` with drafted=True). A matcher's draft from a one-token
        match and one from a sixteen-token match are different bets, and one
        acceptance rate over both made the planner stop drafting for both
        (docs/benchmarks.md 19). Drafts of bucket 0 (a model's) and seeded
        requests sampled by rejection keep their whole draft (their text depends
        on its length). A bucket trimmed to nothing is verified anyway now and
        then (its own `ProbeTimer`), since its acceptance is measured only where
        it is verified.
        """
        drafts = [r.draft for r in requests]
        # A draft without a bucket (a model's) keeps the length the plan and the drafter's own doubt
        # gave it: cutting a drafter that stops when it doubts by its average acceptance cut its
        # confident drafts short (`augury demo`: tau 3.22 -> 2.83, docs/benchmarks.md 19c).
        if not self.adaptive or not any(d.bucket and len(d) for d in drafts):
            return
        fixed = [len(d) if d.bucket == 0 or r.params.load_dependent else None for r, d in zip(requests, drafts)]
        odds = [self._verified_odds(d.bucket) for d in drafts]
        keep = plan_step(self.costs, odds, [len(d) for d in drafts], fixed, self.k_max, batched=self.batched,
                         drafted=True)
        for request, draft, k in zip(requests, drafts, keep):
            if not draft.bucket or not len(draft):
                continue
            if k == 0:
                skips = self.bucket_skips[draft.bucket] = self.bucket_skips.get(draft.bucket, 0) + 1
                timer = self.bucket_probes.setdefault(draft.bucket, ProbeTimer(self.probe_timer.every))
                if timer.due(skips, 0):
                    k = len(draft)
            request.draft = draft.truncated(k)
            if k:
                self.verifying[request.seq.id] = draft.bucket

    def _verified_odds(self, bucket: int) -> DraftOdds:
        """What verifying i + 1 tokens of a draft made in `bucket` commits: every drafted token is there to
        verify (reach 1), each position accepted as measured for the bucket (its prior before that)."""
        tally = self.by_bucket.get(bucket) or DraftTally(self.k_max)
        accept = tally.odds().accept
        return DraftOdds((1.0,) * len(accept), accept)

    def _tokens_left(self, request: Request) -> float:
        """Tokens the request is expected to still generate (`OutputLengths`), at most what it may."""
        return self.costs.lengths.expected_left(len(request.seq.output), request.draft_cap() + 1)

    def _catch_up_spread(self, request: Request, dear: bool) -> float:
        """Tokens the plan spreads a drafter's catch-up over: what the request is expected to still generate
        (`_tokens_left`), but, where the catch-up is dear (`_catch_up_is_dear`), no more than it has
        generated so far plus CATCH_UP_LOOKAHEAD.

        The mean over recent outputs is right on average and wrong for the one request whose answer is
        short: a RAG prompt of 741 tokens answered in 17, among answers that ran to 128, started the 0.5B
        on its first step, and its prefill made the request 0.59x plain (docs/benchmarks.md 32f). Capped
        by what the request has shown, the rule is the ski-rental one: decode without the drafter until
        the tokens generated would have paid for its catch-up, then start it. A prompt whose catch-up
        costs about a step starts its drafter within a few tokens; a long prompt starts it only for an
        answer that runs long, and until then its matcher (a hybrid's) drafts alone, for free.

        A catch-up of at most CHEAP_CATCH_UP_STEPS plain steps is too small to guard, and is spread over
        all the tokens left: capped, an 84-token prompt's (about 5 steps) started the 0.5B 17 tokens into
        its answer and halved its tau (docs/benchmarks.md 33d, 34b).
        """
        if not dear:
            return self._tokens_left(request)
        return min(self._tokens_left(request), len(request.seq.output) + self.CATCH_UP_LOOKAHEAD)

    def _catch_up_is_dear(self, request: Request) -> bool:
        """Whether the sequence's drafter has a catch-up ahead of it (a start, or a long wait to make up)
        that costs more than CHEAP_CATCH_UP_STEPS plain steps at the measured rates. A cheap one is simply
        paid: trying the drafter costs less than the planner's estimates of it are worth. A dear one
        must be earned (`_catch_up_spread`, `_free_tokens`).

        Spec-Bench's short prompts (39-84 tokens) catch the 0.5B up in 2-5 plain steps, its long ones
        (664-741 tokens) in about 28. At 4 steps an 80-token math prompt sat on the line, was weighed
        against its matcher and never started the 0.5B (1.33x plain against 1.40x started,
        docs/benchmarks.md 34b)."""
        step = self.costs.target_time(1, 1)
        return self.costs.catch_up_time(request.catch_up()) > self.CHEAP_CATCH_UP_STEPS * step

    def _start_is_cheap(self, request: Request) -> bool:
        """Whether a probe may start this sequence's drafter: its catch-up (a draft model's prefill of
        the whole sequence) costs at most PROBE_START_SHARE of the plain time of the tokens the plan
        spreads a catch-up over (`_catch_up_spread`), or PROBE_START_STEPS plain steps, whichever is
        more, at the measured rates.

        A probe measures one step; on a long prompt, starting a model drafter for it costs more than
        the probe can win back. Shorter prompts keep their probes: without them a planner whose first
        drafts were poor would never measure the drafter again (docs/benchmarks.md 9b). The plan
        itself still starts a drafter where the catch-up, spread over the steps left, pays
        (`plan_step`'s `behind`).
        """
        step = self.costs.target_time(1, 1)
        spread = self._catch_up_spread(request, self._catch_up_is_dear(request))
        allowed = max(self.PROBE_START_STEPS * step, self.PROBE_START_SHARE * step * spread)
        return self.costs.catch_up_time(request.catch_up()) <= allowed

    def _remeasure(self, request: Request) -> bool:
        """Whether a probe may start an idle drafter to measure it again, whatever its price: it has run
        in none of the last REMEASURE_AFTER finished requests, and this sequence's catch-up is no longer
        than a start the costs still hold (`StepCosts.catch_ups`). Its measurements are then marked
        stale (the probe's start and round replace them).

        A price is corrected only by running: a drafter whose first rounds met a slow spell of a shared
        machine (23 ms a round, where the runs beside it took 17) was priced out of every later request
        of the process, its probes included (docs/benchmarks.md 34a). A slow spell slows the target too,
        whose price every step corrects. The length bound keeps the cost of a retry to starts already
        paid, so a long prompt never starts a drafter here.
        """
        longest = max((tokens for tokens, _ in self.costs.catch_ups), default=0)
        if self.idle_requests < self.REMEASURE_AFTER or not 0 < request.catch_up() <= longest:
            return False
        self.costs.expire_drafter()
        self.idle_requests = 0
        return True

    @staticmethod
    def _probe(
        requests: list[Request], probe: int, caps: list[int], fixed: list[int | None], *, may_start: bool
    ) -> list[int]:
        """A probe is a measurement, not a decision: it drafts for one sequence only.

        It picks one whose drafter already runs if any, so it never sets off a
        burst of drafter prefills. Only the warm-up, or a sequence alone (it
        keeps its drafter for the rest of its run), may start a drafter for a
        probe: among several sequences with no drafter running, a later probe
        is skipped, as one drafter start there cost as much as several steps.
        """
        chosen = next((i for i, r in enumerate(requests) if r.started), 0 if may_start else None)
        return [
            min(f if f is not None else (probe if i == chosen else 0), cap)
            for i, (f, cap) in enumerate(zip(fixed, caps))
        ]
