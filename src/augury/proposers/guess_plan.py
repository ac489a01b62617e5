"""How many guessed tokens a draft model's forward carries, from what guesses and rows measured.

A guess row is a bet: it costs what one more row of the forward costs, and it
saves a whole forward when the drafter would have drafted the guess itself (and
every guess before it). Both sides differ by machine and by text: on an
AVX-512 CPU a 0.5B drafter's fourth row costs about 5% of its first, on an
AVX2 one about 23% (docs/benchmarks.md 36), and a matcher's continuation of
prose agrees with the drafter less often than one of a document being quoted.
So the plan measures both where they happen: the forward's seconds by its
rows (the median of the recent ones), and for the j-th guess of a forward how
often it was checked (every guess before it agreed and the drafter went on)
and agreed. A forward with `own` rows then carries the n guesses that maximise

    seconds(1) * sum_{j <= n} p_1 ... p_j  -  (seconds(own + n) - seconds(own)),

the forwards it expects to save less what its rows cost. A row count measured
fewer than `warm` times counts as costing nothing more, and an acceptance rate
starts at 1/2 (Laplace's rule), so guesses are tried before the measurements
decide.
"""

from __future__ import annotations

from collections import deque
from statistics import median


class GuessPlan:
    """Guesses per forward for one draft model, from its measured row costs and guess acceptance."""

    def __init__(self, max_rows: int, window: int = 16, warm: int = 3) -> None:
        self.max_rows = max_rows
        self.warm = warm
        self.seconds: dict[int, deque[float]] = {rows: deque(maxlen=window) for rows in range(1, max_rows + 1)}
        self.checked = [0] * max_rows  # [j]: forwards whose guess j + 1 was checked
        self.agreed = [0] * max_rows  # [j]: of them, those where it was the drafter's own token

    def guesses(self, own: int, most: int) -> int:
        """How many guesses (at most `most`) a forward of `own` rows of its own should carry."""
        most = min(most, self.max_rows - own)
        if most <= 0:
            return 0
        base = self._seconds(own)
        saved, reach, best, best_gain = 0.0, 1.0, 0, 0.0
        for n in range(1, most + 1):
            reach *= (self.agreed[n - 1] + 1) / (self.checked[n - 1] + 2)
            saved += reach
            gain = self._seconds(1) * saved - (self._seconds(own + n) - base)
            if gain > best_gain:
                best, best_gain = n, gain
        return best

    def _seconds(self, rows: int) -> float:
        """Median seconds of a forward of `rows` rows; a row count not yet measured `warm` times costs what
        the largest well-measured count below it costs (nothing more), so the plan tries it."""
        for r in range(rows, 0, -1):
            if len(self.seconds[r]) >= self.warm:
                return median(self.seconds[r])
        return 0.0

    def observe_forward(self, rows: int, seconds: float) -> None:
        """A drafting forward of one sequence took `seconds` over `rows` rows (catch-up and guesses)."""
        if rows in self.seconds:
            self.seconds[rows].append(seconds)

    def observe_guesses(self, checked: int, agreed: int) -> None:
        """A forward's first `checked` guesses were checked (the ones before each agreed and drafting went
        on), and the first `agreed` of them were the drafter's own tokens."""
        for j in range(checked):
            self.checked[j] += 1
            self.agreed[j] += j < agreed
