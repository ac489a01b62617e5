"""What the target's steps and the drafter's rounds cost, as measured while serving: the planner's cost model.

`ShapeCosts` keeps seconds by shape (a median of the last few samples of a
shape once it was seen a few times, a discounted least-squares line over all
sizes before that); `StepCosts` holds one for the batched target step by
(rows, block), one for a target forward by its activation rows alone (ragged
steps and prompt pieces: `Planner.step_rows`), one for drafting rounds, the
drafter's catch-up (one forward plus a per-token rate), and how long outputs
run (`OutputLengths`, what a catch-up is spread over). Split from planner.py, which decides with them.
"""

from __future__ import annotations

import collections
import statistics


class ShapeCosts:
    """Seconds of one kind of forward by shape, from measurements (see the module doc).

    The median of a shape's last few samples once it has been seen a few
    times; before that a discounted least-squares line t = a + b * size over
    every observation (one sample of a shape, often a warm-up step that also
    paid for first-touch memory, is too noisy to plan on alone). A median, not
    a running mean: on a shared machine a step now and then takes far longer,
    and a mean that such a hiccup pushed up can keep the planner off that
    shape, which it then re-measures only at the next probe.
    """

    MIN_SAMPLES = 3  # samples of a shape before its own median replaces the line
    RECENT = 5  # samples per shape the median is taken over (at least MIN_SAMPLES)
    FORGET = 0.97  # per-observation discount of the line: costs drift (other load, longer caches)

    def __init__(self, forget: float = FORGET) -> None:
        self.forget = forget  # per-observation discount in the least-squares line
        self.recent: dict[object, collections.deque] = {}  # shape -> its last RECENT samples
        self.prior: dict[object, float] = {}  # shape -> seconds measured before this run (`set_prior`)
        self._scale: float | None = None  # `prior_scale`, until a prior or a prior shape's sample changes it
        self._sums = [0.0] * 5  # discounted sums of w, w*n, w*n^2, w*t, w*n*t

    def set_prior(self, shape: object, size: float, seconds: float) -> None:
        """A shape's cost as measured before this run (a saved profile): its level may be stale, its
        ratio to the other prior shapes is kept.

        Read as measured, a curve a quick measurement saved in a slow spell of a
        shared VM priced the plain step at 63.6 ms where this run's took 40.6
        (docs/benchmarks.md 37a): the verification shapes the run measured soon
        took their own prices and were compared with the stale plain step. So a
        prior shape the run has not measured enough costs its prior times the
        run's measured-over-prior ratio of the shapes it has (`time`).
        """
        self.prior[shape] = seconds
        self._scale = None
        self._fit(size, seconds)

    def prior_scale(self) -> float:
        """This run's cost over the prior's, the median over the prior shapes measured MIN_SAMPLES times (1.0
        before any)."""
        if self._scale is None:  # kept between samples: the planner prices many shapes a step
            ratios = [statistics.median(self.recent[shape]) / seconds for shape, seconds in self.prior.items()
                      if seconds > 0 and len(self.recent.get(shape, ())) >= self.MIN_SAMPLES]
            self._scale = statistics.median(ratios) if ratios else 1.0
        return self._scale

    def observe(self, shape: object, size: float, seconds: float) -> None:
        self.recent.setdefault(shape, collections.deque(maxlen=self.RECENT)).append(seconds)
        if shape in self.prior:
            self._scale = None
        self._fit(size, seconds)

    def _fit(self, size: float, seconds: float) -> None:
        """Add one point to the discounted least-squares line (`line`)."""
        new = (1.0, size, size * size, seconds, size * seconds)
        self._sums = [self.forget * s + x for s, x in zip(self._sums, new)]

    def line(self) -> tuple[float, float]:
        """(a, b) of t = a + b * size; b = 0 until observations of different sizes were seen."""
        w, sn, snn, st, snt = self._sums
        if w == 0.0:
            return 0.0, 0.0
        spread = w * snn - sn * sn
        b = (w * snt - sn * st) / spread if spread > 1e-9 * max(w * snn, 1e-30) else 0.0
        b = max(b, 0.0)
        a = max((st - b * sn) / w, 0.0)
        return a, b

    def time(self, shape: object, size: float, line: tuple[float, float] | None = None) -> float:
        """Seconds of a forward of this shape; `line` (a, b) stands in for this one's where the shape was
        seen too few times."""
        recent = self.recent.get(shape, ())
        if len(recent) >= self.MIN_SAMPLES:
            return statistics.median(recent)
        if shape in self.prior:
            return self.prior[shape] * self.prior_scale()
        a, b = line or self.line()
        return a + b * size


class OutputLengths:
    """How long outputs run, from the last requests that finished: the tokens a running request is
    expected to still generate, over which a drafter's catch-up (its prefill of the prompt) is spread.

    Spread over the request's max_tokens instead, a drafter was started for a
    741-token prompt whose answer ended after 16 tokens: 1.91 s of the 0.5B's
    prefill against under a second of decoding (docs/benchmarks.md 19c).
    """

    RECENT = 64  # finished requests remembered

    def __init__(self) -> None:
        self.recent: collections.deque[int] = collections.deque(maxlen=self.RECENT)

    def observe(self, generated: int) -> None:
        self.recent.append(generated)

    def expected_left(self, generated: int, cap: int) -> float:
        """Tokens a request that has generated `generated` is expected to still generate, at most `cap`: the
        mean of what the recent outputs longer than that ran on for; `cap` when none ran that long (or none
        finished yet)."""
        longer = [n - generated for n in self.recent if n > generated]
        return min(float(cap), statistics.fmean(longer)) if longer else float(cap)


class StepCosts:
    """What a step costs: the batched target forward by (rows, block), and one drafting round
    (one drafter forward for the sequences drafting together) by how many sequences it serves."""

    # Before a drafting round over several sequences was measured, assume each
    # extra sequence adds a quarter of a one-sequence round: a weight-bound
    # forward over a few rows costs little more than one (docs/design.md).
    EXTRA_ROW_SHARE = 0.25
    # Weight of a new catch-up sample in the drafter's per-token prefill rate:
    # a running mean that follows drift without jumping at one sample.
    CATCH_UP_SMOOTHING = 0.2
    CATCH_UPS_KEPT = 16  # catch-ups remembered (older ones weigh (1 - CATCH_UP_SMOOTHING) per newer one)

    def __init__(self) -> None:
        self.target = ShapeCosts()
        self.rows = ShapeCosts()  # a target forward by its activation rows alone (ragged blocks, prompt pieces)
        self.draft = ShapeCosts()
        # The rest of a server's step by the sequences it decodes: its time beyond the target forward and
        # the drafting (verification, sampling, the streams' text, releases), what `StepBound` adds.
        self.rest = ShapeCosts()
        # The drafter's last catch-ups, (tokens, seconds): what `catch_up_time` prices by.
        self.catch_ups: collections.deque[tuple[int, float]] = collections.deque(maxlen=self.CATCH_UPS_KEPT)
        self.lengths = OutputLengths()  # how long outputs run: what a catch-up is spread over
        # Set by `expire_drafter`: the drafter's next round and next catch-up replace what was measured.
        self._stale_rounds = self._stale_catch_ups = False

    def observe_target(self, rows: int, block: int, seconds: float) -> None:
        self.target.observe((rows, block), rows * block, seconds)

    def prior_target(self, rows: int, block: int, seconds: float) -> None:
        """A target forward's cost measured before this run (`ShapeCosts.set_prior`)."""
        self.target.set_prior((rows, block), rows * block, seconds)

    def target_time(self, rows: int, block: int) -> float:
        return self.target.time((rows, block), rows * block)

    def observe_rows(self, rows: int, seconds: float) -> None:
        self.rows.observe(rows, rows, seconds)

    def rows_time(self, rows: int) -> float:
        return self.rows.time(rows, rows)

    def observe_rest(self, sequences: int, seconds: float) -> None:
        self.rest.observe(sequences, sequences, max(0.0, seconds))

    def rest_time(self, sequences: int) -> float:
        """The rest of a step over `sequences` decoding sequences (0 before any was measured)."""
        return self.rest.time(sequences, sequences)

    def observe_draft(self, rows: int, rounds: int, seconds: float) -> None:
        """`rounds` drafting rounds over `rows` sequences each took `seconds` in all."""
        if self._stale_rounds:
            self.draft, self._stale_rounds = ShapeCosts(), False
        self.draft.observe(rows, rows, seconds / rounds)

    def draft_round_time(self, rows: int) -> float:
        if rows > 1 and not any(shape > 1 for shape in self.draft.recent):
            return self.draft.time(1, 1) * (1 + self.EXTRA_ROW_SHARE * (rows - 1))
        return self.draft.time(rows, rows)

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        """A drafter fed `tokens` tokens of a sequence before drafting (its start) in `seconds`."""
        if self._stale_catch_ups:
            self.catch_ups.clear()
            self._stale_catch_ups = False
        self.catch_ups.append((tokens, seconds))

    def expire_drafter(self) -> None:
        """Mark the drafter's measurements stale: its next drafting round and its next catch-up replace
        what was measured before, instead of joining it. Until then the old prices stand, so nothing
        is priced free meanwhile (`Planner._remeasure` says when)."""
        self._stale_rounds = self._stale_catch_ups = True

    def catch_up_time(self, tokens: int) -> float:
        """Seconds a drafter takes to feed `tokens` tokens before drafting: one drafter forward (reading its
        weights once) plus a per-token rate measured over the catch-ups beyond that forward.

        A rate alone, seconds over tokens, billed every token for the weights'
        read: a warm-up's one-token catch-up measured 12 ms a token where a
        52-token one costs about 2 ms a token beyond its forward, and priced so,
        a 52-token prompt never started its drafter (docs/benchmarks.md 33b).
        """
        if tokens <= 0:
            return 0.0
        forward = self._drafter_forward()  # as measured now: the first catch-up comes before any round
        keep, weight, excess, seen = 1.0 - self.CATCH_UP_SMOOTHING, 1.0, 0.0, 0.0
        for fed, seconds in reversed(self.catch_ups):
            excess += weight * max(0.0, seconds - forward)
            seen += weight * fed
            weight *= keep
        return forward + tokens * (excess / seen if seen else 0.0)

    def _drafter_forward(self) -> float:
        """One drafting round for one sequence, as measured (0 before any)."""
        return self.draft.time(1, 1) if self.draft.recent else 0.0
