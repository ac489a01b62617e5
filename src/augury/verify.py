"""Verification: which drafted tokens to keep, and the one token the target adds.

Vocabulary (as in vLLM's rejection sampler):
- accepted: drafted tokens the verifier keeps, a prefix of the draft;
- recovered: after the first rejection, a token sampled from
  norm(max(0, p_target - q_draft)) at that position;
- bonus: after all K drafted tokens were accepted, a token sampled from
  p_target at position K + 1.

Rejection sampling accepts a drafted x with probability
min(1, p_target(x) / q_draft(x)). Together with the recovered distribution this
makes every committed token distributed exactly as p_target, whatever the draft
(Leviathan et al. 2023; Chen et al. 2023). A deterministic draft (q_draft None:
prompt lookup, another tokenizer's text, greedy drafting) is a point mass on x,
so x is accepted with probability p_target(x) and the recovered distribution is
p_target with x removed. Greedy decoding is the special case where p_target is
one-hot; it is handled by comparing argmaxes, without drawing random numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import Tensor


@dataclass(frozen=True)
class VerifyResult:
    """What one verification commits for one sequence."""

    num_drafted: int
    num_accepted: int  # drafted tokens accepted
    tokens: list[int]  # the accepted tokens, then one recovered or bonus token

    @property
    def all_accepted(self) -> bool:
        """Every drafted token was accepted, so the last token is a bonus token."""
        return self.num_accepted == self.num_drafted


def accept_probability(p_target: Tensor, q_draft: Tensor | None, token: int) -> float:
    """min(1, p_target(x) / q_draft(x)) for one position. p_target, q_draft: [V]."""
    target = float(p_target[token])
    if q_draft is None:
        return min(1.0, target)
    draft = float(q_draft[token])
    if draft <= 0.0:
        return 1.0 if target > 0 else 0.0
    return min(1.0, target / draft)


def recovered_distribution(p_target: Tensor, q_draft: Tensor | None, token: int) -> Tensor:
    """norm(max(0, p_target - q_draft)) for one position; [V] -> [V].

    A deterministic draft is the point mass on `token`. If the residual has no
    mass (p_target equals q_draft up to rounding) p_target itself is returned,
    which is what the residual tends to in that limit.
    """
    if q_draft is None:
        residual = p_target.clone()
        residual[token] = 0.0
    else:
        residual = (p_target - q_draft).clamp_min(0.0)
    total = float(residual.sum())
    if total <= 1e-12:
        return p_target
    return residual / total


class RandomSource(Protocol):
    """Where rejection sampling takes its random numbers from.

    Injectable so that tests can script every accept/reject branch through the
    real verifier (tests/test_exact.py) instead of re-deriving the walk.
    """

    def uniforms(self, k: int) -> list[float]:
        """k independent uniforms in [0, 1), one per drafted position (drawn together, before any is used)."""

    def categorical(self, probs: Tensor) -> int:
        """One token drawn from probs: [V], a distribution (non-negative, summing to 1)."""


class TorchRandom:
    """The default source: a request's torch.Generator, called exactly as seeded runs have always called it.

    uniforms: one torch.rand(k); categorical: one torch.multinomial(probs, 1).
    Changing either call (or their order) would change every seeded output.
    """

    def __init__(self, generator: torch.Generator | None) -> None:
        self.generator = generator

    def uniforms(self, k: int) -> list[float]:
        gen = self.generator
        return torch.rand(k, generator=gen, device=gen.device if gen else "cpu").tolist()

    def categorical(self, probs: Tensor) -> int:
        return int(torch.multinomial(probs, 1, generator=self.generator))


def verify_chain(
    draft_tokens: list[int],
    q_draft: Tensor | None,
    p_target: Tensor,
    *,
    greedy: bool,
    generator: torch.Generator | None = None,
    source: RandomSource | None = None,
) -> VerifyResult:
    """Verify a chain of K drafted tokens against the target.

    draft_tokens: K token ids.
    q_draft: [K, V] draft probabilities, or None for a deterministic draft.
    p_target: [K + 1, V] target probabilities at each drafted position plus
        the one after the last (for the bonus token).
    source: where the uniforms and the recovered/bonus draw come from; by
        default `TorchRandom(generator)`. Greedy verification draws nothing.
    """
    k = len(draft_tokens)
    if greedy:
        best = p_target.argmax(-1).tolist()
        accepted = 0
        while accepted < k and draft_tokens[accepted] == best[accepted]:
            accepted += 1
        return VerifyResult(k, accepted, draft_tokens[:accepted] + [best[accepted]])
    source = TorchRandom(generator) if source is None else source
    uniforms = source.uniforms(k)
    for i, token in enumerate(draft_tokens):
        q_row = None if q_draft is None else q_draft[i]
        if uniforms[i] >= accept_probability(p_target[i], q_row, token):  # accept iff u < min(1, p/q)
            recovered = source.categorical(recovered_distribution(p_target[i], q_row, token))
            return VerifyResult(k, i, draft_tokens[:i] + [recovered])
    bonus = source.categorical(p_target[k])
    return VerifyResult(k, k, [*draft_tokens, bonus])
