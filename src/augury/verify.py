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
one-hot; it is handled by comparing argmaxes, without drawing random numbers
(`verify_greedy`, on the target's greedy tokens alone).

Coupled (seeded) sampling makes a seeded request's text independent of the
drafter and of K, which rejection sampling cannot: there, how many random
numbers a step consumes depends on the draft. Instead the randomness for output
position t is fixed by (seed, t) alone, Gumbel noise g_t over the vocabulary,
and the token at t is argmax(log p_target + g_t), which is exactly a sample from
p_target (the Gumbel-max trick). A drafter that proposes argmax(log q_draft +
g_t) with the same noise agrees with the target whenever the two argmaxes do;
verification then compares tokens, as greedy decoding does, and commits the
target's own coupled token at the first disagreement (or as the bonus). Every
committed token is the one plain coupled sampling would have committed, so the
output is identical with or without speculation, for any drafter and K.
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


def sample(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """Draw one token per row. probs: [N, V] (non-negative, some mass in each row) -> [N] long.

    The inverse CDF over each row's support, in float64, with one uniform per
    row from `generator` (the row's mass scaled in, as torch.multinomial did):
    a draw reads only the tokens the row can emit, where torch.multinomial
    drew an exponential for every one of 152k tokens (docs/benchmarks.md 17).
    """
    device = generator.device if generator is not None else probs.device
    uniforms = torch.rand(probs.shape[0], generator=generator, dtype=torch.float64, device=device).to(probs.device)
    tokens = []
    for row, u in zip(probs, uniforms):
        support = row.nonzero().flatten()
        if support.numel() == 0:
            raise ValueError("sampling needs a distribution with some mass, got all zeros")
        cdf = row[support].double().cumsum(0)
        at = torch.searchsorted(cdf, (u * cdf[-1])[None], right=True).clamp_(max=support.numel() - 1)
        tokens.append(support[at])
    return torch.cat(tokens)


class TorchRandom:
    """The default source: a request's torch.Generator.

    uniforms: one torch.rand(k); categorical: `sampling.sample` (one float64
    uniform, the inverse CDF over the support). Changing either call (or their
    order) changes seeded rejection-sampled outputs
    (tests/test_exact.py pins them).
    """

    def __init__(self, generator: torch.Generator | None) -> None:
        self.generator = generator

    def uniforms(self, k: int) -> list[float]:
        gen = self.generator
        return torch.rand(k, generator=gen, device=gen.device if gen else "cpu").tolist()

    def categorical(self, probs: Tensor) -> int:
        return int(sample(probs[None], self.generator)[0])


def verify_greedy(draft_tokens: list[int], target_tokens: list[int]) -> VerifyResult:
    """Greedy verification: the drafted tokens up to the first that is not the target's choice there, then the
    target's own token (recovered at a mismatch, the bonus after a wholly accepted draft).
    target_tokens: the target's greedy choice at each drafted position and the one after (K + 1 ids)."""
    k = len(draft_tokens)
    accepted = 0
    while accepted < k and draft_tokens[accepted] == target_tokens[accepted]:
        accepted += 1
    return VerifyResult(k, accepted, draft_tokens[:accepted] + [target_tokens[accepted]])


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
        return verify_greedy(draft_tokens, p_target.argmax(-1).tolist())
    source = TorchRandom(generator) if source is None else source
    uniforms = source.uniforms(k)
    for i, token in enumerate(draft_tokens):
        q_row = None if q_draft is None else q_draft[i]
        if uniforms[i] >= accept_probability(p_target[i], q_row, token):  # accept iff u < min(1, p/q)
            recovered = source.categorical(recovered_distribution(p_target[i], q_row, token))
            return VerifyResult(k, i, draft_tokens[:i] + [recovered])
    bonus = source.categorical(p_target[k])
    return VerifyResult(k, k, [*draft_tokens, bonus])


# -- coupled (seeded) sampling ------------------------------------------------------------

_MASK64 = (1 << 64) - 1
_GAMMA, _MUL1, _MUL2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def _mix64(x: int) -> int:
    """splitmix64's finalizer: a bijection on 64-bit integers that scatters nearby inputs."""
    x = (x + _GAMMA) & _MASK64
    x = ((x ^ (x >> 30)) * _MUL1) & _MASK64
    x = ((x ^ (x >> 27)) * _MUL2) & _MASK64
    return x ^ (x >> 31)


def _int64(x: int) -> int:
    """A 64-bit pattern as the signed integer torch's int64 holds."""
    return x - (1 << 64) if x >= 1 << 63 else x


def _shr(x: Tensor, bits: int, out: Tensor) -> Tensor:
    """Logical right shift of int64 bit patterns into `out` (torch's >> on int64 keeps the sign)."""
    return torch.bitwise_right_shift(x, bits, out=out).bitwise_and_((1 << (64 - bits)) - 1)


def _key(seed: int, position: int) -> int:
    if position < 0:
        raise ValueError(f"coupled noise needs position >= 0, got {position}")
    return _mix64(_mix64(seed & _MASK64) ^ position)


def token_uniforms(seed: int, position: int, ids: Tensor) -> Tensor:
    """U_t(i) in [0, 1) for each token id of ids [N] (int64): float64 [N], on ids' device.

    Token i's number is `_mix64(key + i * gamma)` with key = a hash of (seed,
    position): splitmix64's (i + 1)-th output from state key, a function of
    (seed, position, i) alone. So any set of tokens gets its numbers without
    drawing the rest of the vocabulary (a sampler over a top-p nucleus of a few
    hundred tokens reads only those), in any order, on any device. torch's
    int64 arithmetic wraps as 64-bit patterns do; tests/test_coupled.py checks
    each number against `_mix64` in Python integers.
    """
    z = ids.to(torch.int64, copy=True).add_(1).mul_(_int64(_GAMMA)).add_(_int64(_key(seed, position)))
    t = torch.empty_like(z)  # in place with one scratch tensor: a full row is 152k numbers
    z.bitwise_xor_(_shr(z, 30, t)).mul_(_int64(_MUL1))
    z.bitwise_xor_(_shr(z, 27, t)).mul_(_int64(_MUL2))
    z.bitwise_xor_(_shr(z, 31, t))
    return _shr(z, 11, t).to(torch.float64).mul_(2.0**-53)  # the top 53 bits: every double in [0, 1) on a grid


def coupled_noise(seed: int, position: int, vocab_size: int, device: torch.device | str = "cpu") -> Tensor:
    """Gumbel noise g_t = -log(-log U_t): [vocab_size] float64 for output position t of a request seeded
    with `seed`.

    A function of (seed, position, token) alone (`token_uniforms`), never of
    the batch, K, the drafter or how many numbers were drawn before. Positions
    count output tokens: 0 is the first generated token. A drafter uses the
    target's vocabulary size, so that token i sees the same noise on both sides.
    """
    if vocab_size <= 0:
        raise ValueError(f"coupled noise needs vocab_size > 0, got {vocab_size}")
    return -torch.log(-torch.log(token_uniforms(seed, position, torch.arange(vocab_size, device=device))))


def coupled_sample_reference(probs: Tensor, seed: int, position: int) -> int:
    """`coupled_sample` over the whole vocabulary: argmax(p / E), E = -log U_position. probs: [V]."""
    ids = torch.arange(probs.shape[-1], device=probs.device)
    return int((probs.double() / -torch.log(token_uniforms(seed, position, ids))).argmax())


def coupled_sample(probs: Tensor, seed: int, position: int) -> int:
    """argmax(log probs + g_position): the token at output position `position`. probs: [V].

    Over random seeds this is distributed exactly as probs (the maximum of
    log p_i + Gumbel noise falls on i with probability p_i); tokens of zero
    probability never win, and a one-hot probs (greedy) gives its argmax
    whatever the seed. Computed as argmax(p / E) with E = -log U = exp(-g)
    over the tokens probs can emit only: top-k, top-p and min-p leave a few
    hundred of 152k, and their numbers come without the others
    (`token_uniforms`), so a draw costs microseconds where the whole
    vocabulary's noise cost milliseconds (docs/benchmarks.md 17). The same
    values in the same index order as `coupled_sample_reference`, so the same
    token (tests/test_coupled.py). Drafters and the verifier must both call
    this function, not re-derive it.
    """
    support = probs.nonzero().flatten()
    if support.numel() == 0:
        raise ValueError("coupled sampling needs a distribution with some mass, got all zeros")
    exponentials = -torch.log(token_uniforms(seed, position, support))
    return int(support[(probs[support].double() / exponentials).argmax()])


def verify_coupled(draft_tokens: list[int], p_target: Tensor, seed: int, start_position: int) -> VerifyResult:
    """Verify a chain of K drafted tokens by coupled sampling: accepted while they equal the target's coupled tokens.

    draft_tokens: K token ids (from any drafter; one that drafts
        argmax(log q_draft + g_t) with `coupled_noise` is accepted most often).
    p_target: [K + 1, V] target probabilities at each drafted position plus the
        one after the last, computed exactly as for `verify_chain`.
    start_position: the output position of the first drafted token (the number
        of output tokens committed before this step).
    The committed tokens are the accepted ones, then the target's coupled token
    at the first mismatch (recovered) or after the last drafted token (bonus):
    exactly what plain coupled sampling commits at those positions. No
    q_draft is needed, and no random state is consumed.
    """
    k = len(draft_tokens)
    for i in range(k + 1):
        token = coupled_sample(p_target[i], seed, start_position + i)
        if i == k or token != draft_tokens[i]:
            return VerifyResult(k, i, [*draft_tokens[:i], token])
    raise AssertionError("unreachable: the loop returns at i == k")
