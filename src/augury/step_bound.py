"""A bound on a step's time (`augury serve --max-step-ms`): how many rows a step may hold, what it drafts.

A step holds a row for every running stream, every drafted token it verifies
and every prompt token it feeds, and on a CPU each row costs real time (a
16-row step of a 1.5B model is 4.8x a 1-row one on an AVX2 Zen 2,
docs/benchmarks.md 25a), so each stream's time per token grows with the load.
Given a time, `StepBound` reads the planner's measured forward costs
(`StepCosts.rows`) for the rows that fit, plus the measured rest of a step
(`StepCosts.rest`: verifying, sampling, the streams' text); the scheduler then runs no more
sequences than that (`seats`), cuts the plan's K and the trimmed drafts to it
(`fit`) and feeds prompt pieces from what is left (`pieces`). The bound is
paid for in time to first token: the sequences past the seats wait in the
queue. Split from the planner, which chooses what pays; this only caps it.
"""

from __future__ import annotations

from collections.abc import Sequence

from augury.step_costs import StepCosts


class StepBound:
    """The rows and drafts of a step that takes at most `seconds` by measured costs (see the module doc)."""

    def __init__(self, seconds: float, costs: StepCosts, *, batched: bool, limit: int) -> None:
        """costs: the planner's (`Planner.costs`), read as they are measured; batched: the drafter serves
        every drafting sequence in one forward a round; limit: the most rows a step can hold at all."""
        self.seconds = seconds
        self.costs = costs
        self.batched = batched
        self.limit = limit
        self._line: tuple[float, float] | None = None  # the last cost line with a slope (`_forward_line`)

    def rows(self) -> int:
        """The most activation rows (decode rows, drafted tokens and prompt pieces together) a target forward
        may hold to take at most `seconds`: at most `limit`, at least 1 (a step too slow alone still runs),
        `limit` until two forward sizes were measured.

        Sizes are tried upwards and the first too slow ends the count, each by its own median once seen a
        few times, else by the line through all sizes: on a Zen 2 a forward costs 56 ms at 1 row, 122 at 6,
        164 at 9, and the line through all of them put 9 rows under 145 ms (docs/benchmarks.md 30). Each
        row is counted as a sequence for the rest of the step (`StepCosts.rest_time`): priced by its
        forward alone, a bound of 80 ms let 16 streams in whose time per token was 80 ms at the median
        and 91-93 at p99 (docs/benchmarks.md 38d)."""
        line = self._forward_line()
        if line is None:
            return self.limit
        rows = 0
        while rows < self.limit and self._step_time(rows + 1, rows + 1, line) <= self.seconds + 1e-9:
            rows += 1
        return max(1, rows)

    def _step_time(self, rows: int, sequences: int, line: tuple[float, float] | None) -> float:
        """A step's target forward over `rows` (its size's median, else the line) and its rest for `sequences`."""
        return self.costs.rows.time(rows, rows, line) + self.costs.rest_time(sequences)

    def seats(self, max_batch: int) -> int:
        """Sequences that may run at once: no more than `max_batch`, nor than a step's rows (one each)."""
        return min(max_batch, self.rows())

    def pieces(self, budget: int, decode_rows: int) -> int:
        """Prompt tokens a step beside `decode_rows` rows may feed: `budget` at most, the rows left, and at
        least one token, so that prompts keep entering. With nothing decoding, no stream waits on the step
        (the bound is one on time per output token) and the prompts take the whole budget, as the planner
        gives it: cut to a bounded step's rows, a lone prompt was fed only those rows a step."""
        if decode_rows == 0:
            return budget
        return max(1, min(budget, self.rows() - decode_rows))

    def fit(self, lengths: Sequence[int], fixed: Sequence[bool], other_rows: int, *, drafted: bool) -> list[int]:
        """Draft lengths cut, the longest first, until the step is predicted to take at most `seconds`: its
        target forward by the measured cost of its rows (each draft, the target's own token per sequence,
        and `other_rows` of prompt pieces) with the rest of a step for its sequences (`StepCosts.rest_time`),
        and before drafting (`drafted` False) its drafting rounds at
        the measured time of a round. A fixed length (a seeded request sampled by rejection, whose text
        depends on it) is never cut, so the step may still run over."""
        out = list(lengths)
        line = self._forward_line()

        def predicted() -> float:
            rows = sum(n + 1 for n in out) + other_rows
            target = self._step_time(rows, len(out), line)
            drafting = [n for n in out if n]
            if drafted or not drafting:
                return target
            rounds = max(drafting) if self.batched else sum(drafting)
            return target + rounds * self.costs.draft_round_time(len(drafting) if self.batched else 1)

        while predicted() > self.seconds:
            cuttable = [i for i, n in enumerate(out) if n > 0 and not fixed[i]]
            if not cuttable:
                break
            out[max(cuttable, key=lambda i: out[i])] -= 1
        return out

    def _forward_line(self) -> tuple[float, float] | None:
        """The forward's cost line against its rows: the last one with a slope (None before there was one).

        A discounted line through forwards of one size has no slope: a server that ran 6-row steps for a
        few hundred steps forgot every other size, and a bound that read that as unmeasured let 16
        sequences in at once (docs/benchmarks.md 30)."""
        fixed, per_row = self.costs.rows.line()
        if per_row > 0.0:
            self._line = (fixed, per_row)
        return self._line
