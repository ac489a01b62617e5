"""What drafting delivers, per drafted position: the odds the planner weighs, and the counts behind them.

Split from planner.py, which decides with them. `DraftTally` counts, per
drafted position, how often a draft got that far and was accepted that far;
the planner keeps one over every draft (what asking for K delivers) and one
per kind of draft (`Draft.bucket`: the suffix matcher's match length, say),
whose odds decide how much of a draft already made is worth verifying.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DraftOdds:
    """What drafting delivers, per drafted position i (0-based), as measured.

    reach[i]: probability the drafter drafts at least i + 1 tokens when allowed
    more than i (a confident-drafting drafter stops early when it doubts).
    accept[i]: probability the first i + 1 drafted tokens are all accepted,
    given at least i + 1 were drafted. Measured per position rather than
    derived from one acceptance rate: acceptance is strongly correlated along a
    draft (a drafter on a roll stays right), which a single independent rate
    badly underestimates for long drafts.
    """

    reach: tuple[float, ...]
    accept: tuple[float, ...]

    @classmethod
    def independent(cls, alpha: float, k_max: int, continue_rate: float = 1.0) -> "DraftOdds":
        """Each drafted token accepted with rate alpha independently (the prior before measurements)."""
        return cls(
            tuple(continue_rate**i for i in range(k_max)), tuple(alpha ** (i + 1) for i in range(k_max))
        )

    def tokens(self, k: int) -> float:
        """Expected tokens one verification commits with k allowed: accepted prefix + the target's own."""
        return 1.0 + sum(r * a for r, a in zip(self.reach[:k], self.accept[:k]))

    def drafted(self, k: int) -> float:
        """Expected tokens drafted with k allowed."""
        return sum(self.reach[:k])

    def scaled(self, factor: float) -> "DraftOdds":
        """The same odds with acceptance scaled (a request accepting more or less than the server's mean)."""
        return DraftOdds(self.reach, tuple(min(1.0, a * factor) for a in self.accept))


class DraftTally:
    """Server-wide per-position counts behind `DraftOdds`, with a prior for positions rarely seen."""

    PRIOR_ALPHA = 0.7  # acceptance assumed before anything was measured (a typical same-family drafter)
    PRIOR_WEIGHT = 4.0  # observations' worth of trust in the prior: a few steps outweigh it

    def __init__(self, k_max: int) -> None:
        self.allowed = [0] * k_max  # steps that allowed at least i + 1 tokens
        self.drafted = [0] * k_max  # steps that drafted at least i + 1
        self.accepted = [0] * k_max  # steps whose first i + 1 drafted tokens were all accepted

    def record_draft(self, allowed: int, drafted: int) -> None:
        for i in range(allowed):
            self.allowed[i] += 1
        for i in range(drafted):
            self.drafted[i] += 1

    def record_verified(self, accepted: int) -> None:
        for i in range(accepted):
            self.accepted[i] += 1

    def odds(self) -> DraftOdds:
        """Measured odds, each position pulled towards a prior worth PRIOR_WEIGHT observations.

        A position's prior continues the chain measured before it: the odds at
        i - 1 times the conditional acceptance measured from i - 2 to i - 1
        (PRIOR_ALPHA at the first position). The independent prior alpha^(i+1)
        made deep positions look poor exactly where they are drafted least, so
        a planner that trusted it kept drafting short and never measured the
        long drafts a confident drafter gets right (measured in docs/design.md).
        """
        w = self.PRIOR_WEIGHT
        reach = tuple((d + w) / (n + w) for d, n in zip(self.drafted, self.allowed))
        accept: list[float] = []
        for a, d in zip(self.accepted, self.drafted):
            if not accept:
                prior = self.PRIOR_ALPHA
            else:
                before = accept[-2] if len(accept) > 1 else 1.0
                prior = accept[-1] * min(1.0, accept[-1] / max(before, 1e-9))
            accept.append((a + w * prior) / (d + w))
        return DraftOdds(reach, tuple(accept))
