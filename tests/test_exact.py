"""Exact losslessness through the real verifier and the real drafters.

For a vocabulary of 5 every way one speculative step can go is enumerated,
and each branch is run through the real code:
- the draft: a drafter's own `propose` on a `Sequence`; a sampled drafter's
  token choices are scripted one at a time (its call of `sampling.sample`),
  and each draft is weighted by the q_draft the drafter reports;
- accept/reject: a scripted `RandomSource` hands `verify_chain` a uniform on
  either side of each acceptance probability min(1, p_target / q_draft),
  weighted by that interval's length;
- the recovered or bonus token: the scripted source returns each token in
  turn, weighted by the distribution `verify_chain` asked it to sample from.
The tokens committed in each branch are what `verify_chain` returned. Summed
over branches (and over a second step where the first committed only one
token), the first one and the first two committed tokens must be distributed
as plain sampling from p_target to 1e-9 in float64: for sampled and
deterministic drafts, K in {1, 2, 3}, and every sampling control, penalties
included (p_target rows for a draft come from `sampling.probabilities` with
the drafted tokens, as the engine builds them).

The target's logits for a context come from one forward of the whole context,
so the drafted rows and the plain rows see the same logits; that a block
forward gives the same logits as token-by-token decoding is the decoder's
batch-invariance, tested elsewhere. Probabilities are renormalized in float64
(p_target and q_draft alike) so that fp32 rounding of their sums does not blur
the comparison.

The mutation test at the end breaks `verify_chain` in three ways and shows
that this check fails for each.
"""

from __future__ import annotations

import inspect
import math
import textwrap
from collections import Counter
from unittest import mock

import pytest
import torch
from torch import Tensor

import augury.proposers.draft_model as draft_model_module
import augury.verify as verify
from augury.proposers.base import Sequence
from augury.sampling import SamplingParams, probabilities
from tests.proposer_cases import PROPOSER_CASES, ProposerCase
from tests.tiny import tiny_model

VOCAB = 5
PROMPT = (1, 2, 3, 1, 2)  # repeats itself, so that the matchers have something to draft
TOLERANCE = 1e-9

PARAMS = {
    "t1": SamplingParams(temperature=1.0),
    "t0.6-topk3": SamplingParams(temperature=0.6, top_k=3),
    "t1.2-topp0.75": SamplingParams(temperature=1.2, top_p=0.75),
    "t0.9-minp0.15": SamplingParams(temperature=0.9, min_p=0.15),
    "repetition1.6": SamplingParams(temperature=1.0, repetition_penalty=1.6),
    "presence0.9": SamplingParams(temperature=1.0, presence_penalty=0.9),
    "frequency0.7": SamplingParams(temperature=1.0, frequency_penalty=0.7),
    "everything": SamplingParams(
        temperature=0.8, top_k=4, top_p=0.9, min_p=0.05,
        repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3,
    ),
    "greedy": SamplingParams(temperature=0.0),
    "greedy-penalties": SamplingParams(temperature=0.0, repetition_penalty=1.5, frequency_penalty=0.5),
}

CASES = {case.name: case for case in PROPOSER_CASES}
# Sampled drafts (the model drafters, one with a confidence stop: drafts of
# varying length) and deterministic ones (the matchers, and the cross-tokenizer
# drafter, which drafts greedily through text at any temperature).
DRAFTERS = ["model", "model-lean", "ngram", "suffix", "cross"]


def normalized(probs: Tensor) -> Tensor:
    """probs: [..., V] -> float64 rows summing to 1."""
    probs = probs.double()
    return probs / probs.sum(-1, keepdim=True)


class Target:
    """The tiny target's logits as a function of the whole context (one cached forward per context)."""

    def __init__(self) -> None:
        self.model = tiny_model(vocab=VOCAB, seed=21, hidden=16, layers=2)
        self._logits: dict[tuple[int, ...], Tensor] = {}

    def logits(self, context: tuple[int, ...]) -> Tensor:
        """[V] logits after the context."""
        if context not in self._logits:
            decoder = self.model.decoder
            cache = decoder.new_cache(1, len(context) + 8)
            out = decoder.forward(torch.tensor([context]), cache, logits_rows=slice(-1, None))
            self._logits[context] = out[0, -1]
        return self._logits[context]

    def p_rows(self, context: tuple[int, ...], drafted: list[int], params: SamplingParams) -> Tensor:
        """p_target [len(drafted) + 1, V] for verifying `drafted` after the context, as the engine computes it."""
        rows = torch.stack([self.logits(context + tuple(drafted[:i])) for i in range(len(drafted) + 1)])
        return normalized(probabilities(rows, params, list(PROMPT), list(context[len(PROMPT):]), list(drafted)))

    def p_plain(self, context: tuple[int, ...], params: SamplingParams) -> Tensor:
        """p_target [V] of plain decoding after the context."""
        return normalized(probabilities(self.logits(context)[None], params, list(PROMPT), list(context[len(PROMPT):])))[0]


def enumerate_drafts(
    case: ProposerCase, target: Target, context: tuple[int, ...], k: int, params: SamplingParams
) -> list[tuple[list[int], Tensor | None, float]]:
    """Every draft the drafter can propose after the context: (tokens, q_draft [n, V] float64 or None, probability).

    The drafter runs for real; only its random choices are scripted. A run
    that asks for more choices than scripted branches on the next one over
    the tokens its reported q_draft row gives positive probability.
    """
    drafts = []

    def run(choices: list[int]) -> None:
        asked: list[Tensor] = []

        def scripted(probs: Tensor, generator: torch.Generator | None) -> Tensor:  # probs: [1, V]
            asked.append(probs)
            return torch.tensor([choices[len(asked) - 1] if len(asked) <= len(choices) else 0])

        proposer = case.build(target.model, 1)
        seq = Sequence(list(context), params, prompt_len=len(PROMPT), generator=torch.Generator().manual_seed(0))
        with mock.patch.object(draft_model_module, "sample", scripted):
            proposer.start(seq)
            draft = proposer.propose(seq, k)
            proposer.finish(seq)
        assert len(draft.tokens) <= k
        assert asked or draft.q_draft is None or not draft.tokens, (
            f"{case.name} reported a q_draft but did not sample through sampling.sample: its draws cannot be scripted")
        if not asked:
            drafts.append((list(draft.tokens), None if draft.q_draft is None else normalized(draft.q_draft), 1.0))
            return
        assert draft.q_draft is not None, f"{case.name} sampled its draft but reported no q_draft"
        assert len(asked) == len(draft.tokens), f"{case.name}: {len(asked)} draws for {len(draft.tokens)} tokens"
        q_draft = normalized(draft.q_draft)
        if len(asked) > len(choices):
            row = q_draft[len(choices)]
            for token in range(VOCAB):
                if row[token] > 0:
                    run(choices + [token])
            return
        assert draft.tokens == choices, f"{case.name} drafted {draft.tokens}, but sampled {choices}"
        weight = math.prod(float(q_draft[i, token]) for i, token in enumerate(choices))
        drafts.append((list(draft.tokens), q_draft, weight))

    run([])
    return drafts


def reference_accept(p_row: Tensor, q_row: Tensor | None, token: int) -> float:
    """min(1, p_target(x) / q_draft(x)), q_draft a point mass when None (the test's own formula)."""
    if q_row is None:
        return min(1.0, float(p_row[token]))
    return min(1.0, float(p_row[token]) / float(q_row[token]))


class ScriptedSource:
    """A RandomSource returning given uniforms and a given categorical outcome; it records what it was asked."""

    def __init__(self, uniforms: list[float], token: int) -> None:
        self._uniforms = uniforms
        self.token = token
        self.asked: Tensor | None = None

    def uniforms(self, k: int) -> list[float]:
        assert k == len(self._uniforms), f"verify_chain asked for {k} uniforms for {len(self._uniforms)} tokens"
        return list(self._uniforms)

    def categorical(self, probs: Tensor) -> int:
        assert self.asked is None, "verify_chain drew two tokens in one step"
        self.asked = probs.clone()
        return self.token


def verifier_branches(
    draft_tokens: list[int], q_draft: Tensor | None, p_target: Tensor, greedy: bool
) -> list[tuple[tuple[int, ...], float]]:
    """Every outcome of `verify_chain` on one draft, with its probability: (committed tokens, probability).

    q_draft: [K, V] or None; p_target: [K + 1, V].
    """
    k = len(draft_tokens)
    accept = [
        reference_accept(p_target[i], None if q_draft is None else q_draft[i], token)
        for i, token in enumerate(draft_tokens)
    ]
    branches = []
    for rejected_at in range(k + 1):  # the first rejected position; k: every drafted token accepted
        weight = math.prod(accept[:rejected_at]) * (1.0 - accept[rejected_at] if rejected_at < k else 1.0)
        if weight <= 0.0:
            continue
        uniforms = [a / 2 for a in accept[:rejected_at]]  # inside [0, a): accepted
        if rejected_at < k:
            uniforms.append((1.0 + accept[rejected_at]) / 2)  # inside [a, 1): rejected
        uniforms += [0.5] * (k - len(uniforms))  # never looked at after a rejection
        probe = ScriptedSource(uniforms, token=0)
        result = verify.verify_chain(draft_tokens, q_draft, p_target, greedy=greedy, source=probe)
        if probe.asked is None:  # greedy verification draws nothing
            branches.append((tuple(result.tokens), weight))
            continue
        for token in range(VOCAB):
            chance = float(probe.asked[token])
            if chance == 0.0:
                continue
            source = ScriptedSource(uniforms, token=token)
            result = verify.verify_chain(draft_tokens, q_draft, p_target, greedy=greedy, source=source)
            assert source.asked is not None and torch.equal(source.asked, probe.asked)
            branches.append((tuple(result.tokens), weight * chance))
    return branches


class Speculation:
    """The exact distribution of what speculative steps commit, for one drafter, K and sampling setting."""

    def __init__(self, case: ProposerCase, target: Target, k: int, params: SamplingParams) -> None:
        self.case, self.target, self.k, self.params = case, target, k, params
        self._steps: dict[tuple[int, ...], Counter] = {}
        self.drafted_mass = 0.0  # expected drafted tokens over every step enumerated (vacuity guard)

    def step(self, context: tuple[int, ...]) -> Counter:
        """{committed tokens: probability} for one step after the context."""
        if context not in self._steps:
            outcomes: Counter = Counter()
            for tokens, q_draft, weight in enumerate_drafts(self.case, self.target, context, self.k, self.params):
                self.drafted_mass += weight * len(tokens)
                p_target = self.target.p_rows(context, tokens, self.params)
                for committed, chance in verifier_branches(tokens, q_draft, p_target, self.params.greedy):
                    outcomes[committed] += weight * chance
            self._steps[context] = outcomes
        return self._steps[context]

    def first_tokens(self, context: tuple[int, ...], length: int) -> Counter:
        """{first `length` committed tokens: probability}, running further steps where one committed fewer."""
        dist: Counter = Counter()
        for tokens, prob in self.step(context).items():
            if len(tokens) >= length:
                dist[tokens[:length]] += prob
            else:
                for more, prob2 in self.first_tokens(context + tokens, length - len(tokens)).items():
                    dist[tokens + more] += prob * prob2
        return dist


def plain_first_tokens(target: Target, context: tuple[int, ...], params: SamplingParams, length: int) -> Counter:
    """{first `length` tokens: probability} under plain sampling from p_target."""
    dist: Counter = Counter({(): 1.0})
    for _ in range(length):
        grown: Counter = Counter()
        for tokens, prob in dist.items():
            p_target = target.p_plain(context + tokens, params)
            for token in range(VOCAB):
                if p_target[token] > 0:
                    grown[tokens + (token,)] += prob * float(p_target[token])
        dist = grown
    return dist


def deviation(case: ProposerCase, target: Target, k: int, params: SamplingParams) -> tuple[float, float]:
    """(largest |P_speculative - P_plain| over the first one and two tokens, incl. total mass; drafted mass)."""
    spec = Speculation(case, target, k, params)
    worst = 0.0
    for length in (1, 2):
        got = spec.first_tokens(PROMPT, length)
        want = plain_first_tokens(target, PROMPT, params, length)
        worst = max(worst, abs(sum(got.values()) - 1.0))
        worst = max([worst] + [abs(got.get(t, 0.0) - want.get(t, 0.0)) for t in set(got) | set(want)])
    return worst, spec.drafted_mass


@pytest.fixture(scope="module")
def target() -> Target:
    return Target()


@pytest.mark.parametrize("params_name", list(PARAMS))
@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("drafter", DRAFTERS)
def test_first_two_committed_tokens_follow_p_target(drafter, k, params_name, target):
    worst, drafted = deviation(CASES[drafter], target, k, PARAMS[params_name])
    assert drafted > 0, f"{drafter} drafted nothing in any enumerated step: the check would be vacuous"
    assert worst < TOLERANCE, (
        f"{drafter}, K={k}, {params_name}: the first committed tokens differ from p_target by {worst:.3e} "
        f"(tolerance {TOLERANCE})"
    )


def test_default_source_draws_what_the_generator_always_drew():
    """TorchRandom's calls, pinned: k uniforms first, then the recovered or bonus token through
    sampling.sample on the same generator (seeded rejection-sampled runs keep their text)."""
    p_target = torch.softmax(torch.randn(3, 7, generator=torch.Generator().manual_seed(0)), -1)
    q_draft = torch.softmax(torch.randn(2, 7, generator=torch.Generator().manual_seed(1)), -1)
    for seed in range(200):
        result = verify.verify_chain([2, 5], q_draft, p_target, greedy=False,
                                     generator=torch.Generator().manual_seed(seed))
        gen = torch.Generator().manual_seed(seed)
        uniforms = torch.rand(2, generator=gen).tolist()
        expected: list[int] = []
        for i, token in enumerate([2, 5]):
            if uniforms[i] >= verify.accept_probability(p_target[i], q_draft[i], token):
                residual = verify.recovered_distribution(p_target[i], q_draft[i], token)
                expected.append(int(verify.sample(residual[None], gen)[0]))
                break
            expected.append(token)
        else:
            expected.append(int(verify.sample(p_target[2][None], gen)[0]))
        assert result.tokens == expected, f"seed {seed}: {result.tokens} != {expected}"


# -- the check must be able to fail: three broken verifiers ---------------------------------

MUTANTS = {
    # accept when u >= min(1, p/q) instead of u < min(1, p/q)
    "accept-compared-with-the-wrong-side": (
        "verify_chain", "if uniforms[i] >= accept_probability(", "if uniforms[i] < accept_probability("),
    # sample the recovered token from max(0, p_target - q_draft) without dividing by its mass (torch.multinomial
    # would rescale it, but RandomSource.categorical takes a distribution: an inverse-CDF source would not)
    "residual-not-normalized": ("recovered_distribution", "return residual / total", "return residual"),
    # the bonus token from the last drafted position's q_draft instead of p_target's extra row
    "bonus-from-q_draft": (
        "verify_chain", "source.categorical(p_target[k])",
        "source.categorical(p_target[k] if q_draft is None else q_draft[k - 1])"),
}


def mutate(monkeypatch: pytest.MonkeyPatch, function: str, old: str, new: str) -> None:
    """Replace verify.<function> by its own source with `old` changed to `new` (which must occur exactly once)."""
    source = textwrap.dedent(inspect.getsource(getattr(verify, function)))
    assert source.count(old) == 1, f"the mutation site {old!r} is no longer in verify.{function}: update MUTANTS"
    namespace = dict(vars(verify))
    exec(compile(source.replace(old, new), f"<mutant of verify.{function}>", "exec"), namespace)
    monkeypatch.setattr(verify, function, namespace[function])


@pytest.mark.parametrize("mutant", list(MUTANTS))
def test_exact_check_fails_for_a_broken_verifier(mutant, target, monkeypatch):
    case, params = CASES["model"], PARAMS["t1"]  # sampled drafts, K = 1: the bonus is the second token
    intact, _ = deviation(case, target, 1, params)
    assert intact < TOLERANCE
    mutate(monkeypatch, *MUTANTS[mutant])
    broken, _ = deviation(case, target, 1, params)
    assert broken > 1e-3, f"the exact check did not notice the mutant '{mutant}' (deviation {broken:.2e})"
