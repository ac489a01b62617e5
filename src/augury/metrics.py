"""Speculative decoding statistics: plain data, plus a one-line summary.

τ (tau) is the mean number of tokens a verification forward commits, the
recovered or bonus token included, so plain decoding has τ = 1 and a drafter
whose K tokens are always accepted has τ = K + 1. α is accepted / drafted.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class SpecStats:
    """Counters for one request, or summed over many with `merge`."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    steps: int = 0  # verification (decode) forwards of the target
    target_forwards: int = 0  # including prefill
    draft_forwards: int = 0
    drafted_at: list[int] = field(default_factory=list)  # per draft position: times a token was drafted there
    accepted_at: list[int] = field(default_factory=list)  # per draft position: times it was accepted
    prefill_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    total_s: float = 0.0

    def record_step(self, num_drafted: int, num_accepted: int) -> None:
        """One verification forward that checked num_drafted tokens and kept num_accepted."""
        self.steps += 1
        self.target_forwards += 1
        self.drafted += num_drafted
        self.accepted += num_accepted
        while len(self.drafted_at) < num_drafted:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(num_drafted):
            self.drafted_at[i] += 1
            if i < num_accepted:
                self.accepted_at[i] += 1

    @property
    def committed_in_steps(self) -> int:
        """Tokens verification produced: the accepted ones plus one per step."""
        return self.accepted + self.steps

    @property
    def alpha(self) -> float:
        """Fraction of drafted tokens accepted."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tau(self) -> float:
        """Mean tokens committed per verification forward (1.0 for plain decoding)."""
        return self.committed_in_steps / self.steps if self.steps else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_at, self.drafted_at)]

    @property
    def decode_s(self) -> float:
        return max(self.total_s - self.prefill_s, 1e-9)

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens over wall time after prefill (decode speed)."""
        return self.generated_tokens / self.decode_s if self.generated_tokens else 0.0

    @property
    def other_s(self) -> float:
        return max(self.total_s - self.prefill_s - self.draft_s - self.verify_s, 0.0)

    def merge(self, other: "SpecStats") -> "SpecStats":
        """Sum of two sets of counters (aggregate over requests)."""
        out = SpecStats()
        for name, value in asdict(self).items():
            theirs = getattr(other, name)
            if isinstance(value, list):
                n = max(len(value), len(theirs))
                value = [(value[i] if i < len(value) else 0) + (theirs[i] if i < len(theirs) else 0) for i in range(n)]
                setattr(out, name, value)
            else:
                setattr(out, name, value + theirs)
        return out

    def to_dict(self) -> dict:
        data = asdict(self)
        data.update(
            committed_in_steps=self.committed_in_steps,
            alpha=self.alpha,
            tau=self.tau,
            tokens_per_s=self.tokens_per_s,
            acceptance_by_position=self.acceptance_by_position,
            other_s=self.other_s,
        )
        return data

    def summary(self) -> str:
        """One line for the end of `augury generate`."""
        line = (
            f"{self.generated_tokens} tokens in {self.total_s:.2f}s: {self.tokens_per_s:.2f} tok/s "
            f"(prefill {self.prompt_tokens} tokens in {self.prefill_s:.2f}s)"
        )
        if self.drafted:
            by_pos = " ".join(f"{a:.2f}" for a in self.acceptance_by_position)
            line += (
                f" | tau {self.tau:.2f} alpha {self.alpha:.2f} accepted {self.accepted}/{self.drafted}"
                f" by position [{by_pos}] | target forwards {self.target_forwards}"
                f" draft forwards {self.draft_forwards} | draft {self.draft_s:.2f}s verify {self.verify_s:.2f}s"
                f" other {self.other_s:.2f}s"
            )
        return line
