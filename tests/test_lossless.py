"""Losslessness of verification, exactly and statistically.

1. Exact: with a vocabulary of 6 and K in {1, 2, 3}, enumerate every draft and
   every accept/reject branch of one speculative step (using the verifier's own
   accept_probability and recovered_distribution) and show that the first
   committed token, and the first two, are distributed exactly as p_target:
   for sampled and deterministic drafts, with temperature, top-k and top-p.
2. Statistical: whole 3-token continuations sampled by the engine with each
   proposer against the exact distribution of plain sampling (enumerated from
   the same tiny target), chi-square with a fixed seed.
"""

from __future__ import annotations

import itertools
import os
from collections import Counter

import pytest
import torch

from augury.engine import Engine
from augury.sampling import SamplingParams, probabilities
from augury.verify import accept_probability, recovered_distribution
from tests.proposer_cases import PROPOSER_CASES, make_proposer
from tests.tiny import tiny_model

VOCAB = 6


def table_logits(seed: int, context: tuple[int, ...]) -> torch.Tensor:
    """A fixed random 'model': logits [V] as a function of the whole context."""
    gen = torch.Generator().manual_seed(hash((seed, context)) % (2**31))
    return torch.randn(VOCAB, generator=gen) * 1.5


PARAMS = {
    "t1": SamplingParams(temperature=1.0),
    "t0.7-topk3": SamplingParams(temperature=0.7, top_k=3),
    "t1.3-topp0.8": SamplingParams(temperature=1.3, top_p=0.8),
    "t0.9-minp0.1-topk4": SamplingParams(temperature=0.9, min_p=0.1, top_k=4),
    "greedy": SamplingParams(temperature=0.0),
}


def p_target(context, params):
    return probabilities(table_logits(1, context)[None], params)[0].double()


def q_draft(context, params):
    return probabilities(table_logits(2, context)[None], params)[0].double()


def step_outcomes(context, k, params, deterministic):
    """Exact distribution over what one speculative step commits: {tokens: probability}."""
    outcomes: Counter = Counter()

    def walk(prefix, weight):
        i = len(prefix)
        ctx = context + tuple(prefix)
        target = p_target(ctx, params)
        if i == k:
            for y in range(VOCAB):
                outcomes[tuple(prefix) + (y,)] += weight * float(target[y])
            return
        draft = q_draft(ctx, params)
        if deterministic:
            choices = [(int(draft.argmax()), 1.0, None)]
        else:
            choices = [(x, float(draft[x]), draft) for x in range(VOCAB) if draft[x] > 0]
        for x, q_x, q_row in choices:
            accept = accept_probability(target, q_row, x)
            if accept > 0:
                walk(prefix + [x], weight * q_x * accept)
            if accept < 1:
                residual = recovered_distribution(target, q_row, x)
                for y in range(VOCAB):
                    outcomes[tuple(prefix) + (y,)] += weight * q_x * (1 - accept) * float(residual[y])

    walk([], 1.0)
    return outcomes


def committed_distribution(context, k, params, deterministic, length):
    """Distribution of the first `length` committed tokens, running steps until enough are committed."""
    dist: Counter = Counter()
    for tokens, prob in step_outcomes(context, k, params, deterministic).items():
        if len(tokens) >= length:
            dist[tokens[:length]] += prob
        else:
            rest = committed_distribution(context + tokens, k, params, deterministic, length - len(tokens))
            for more, prob2 in rest.items():
                dist[tokens + more] += prob * prob2
    return dist


def plain_distribution(context, params, length):
    dist: Counter = Counter({(): 1.0})
    for _ in range(length):
        nxt: Counter = Counter()
        for tokens, prob in dist.items():
            target = p_target(context + tokens, params)
            for y in range(VOCAB):
                if target[y] > 0:
                    nxt[tokens + (y,)] += prob * float(target[y])
        dist = nxt
    return dist


@pytest.mark.parametrize("params_name", list(PARAMS))
@pytest.mark.parametrize("deterministic", [False, True], ids=["sampled-draft", "deterministic-draft"])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_exact_first_tokens_follow_p_target(k, deterministic, params_name):
    params = PARAMS[params_name]
    context = (3, 1)
    for length in (1, 2):
        spec = committed_distribution(context, k, params, deterministic, length)
        plain = plain_distribution(context, params, length)
        assert abs(sum(spec.values()) - 1.0) < 1e-6, "speculative outcome probabilities do not sum to 1"
        worst = max(abs(spec.get(t, 0.0) - plain.get(t, 0.0)) for t in set(spec) | set(plain))
        assert worst < 1e-6, f"first {length} token(s) differ from p_target by {worst:.2e} (K={k})"


def test_exact_check_detects_a_wrong_verifier(monkeypatch):
    """The enumeration must be able to fail: accepting with p/q uncapped at 1 breaks losslessness."""
    import tests.test_lossless as mod

    def broken(target, q_row, x):
        return float(target[x]) if q_row is None else min(1.0, float(target[x] / q_row[x]) ** 0.5)

    monkeypatch.setattr(mod, "accept_probability", broken)
    spec = committed_distribution((3, 1), 2, PARAMS["t1"], False, 1)
    plain = plain_distribution((3, 1), PARAMS["t1"], 1)
    assert max(abs(spec[t] - plain[t]) for t in plain) > 1e-3


# -- statistical: the engine with each proposer ---------------------------------------

# The draft-model proposer (the speculative core) gets 100k samples; every other
# drafter gets 20k, which keeps the suite within its time budget on 2 cores
# while still detecting a bias of a few percent in any cell.
CORE_SAMPLES = int(os.environ.get("AUGURY_CHI_SAMPLES", 100_000))
OTHER_SAMPLES = int(os.environ.get("AUGURY_CHI_SAMPLES", 20_000))
CONTINUATION = 3
P_THRESHOLD = 1e-3
PROMPT = [1, 2, 3, 1, 2]


def exact_continuations(model, params, prompt, length):
    """P(each length-token continuation) under plain sampling from the tiny target, by enumeration."""
    from augury.models.decoder import Decoder  # noqa: F401  (documentation of what is enumerated)

    probs = {}
    vocab = model.config.vocab_size
    for tokens in itertools.product(range(vocab), repeat=length):
        prob = 1.0
        context = list(prompt)
        output: list[int] = []
        for token in tokens:
            cache = model.decoder.new_cache(1, 64)
            logits = model.decoder.forward(torch.tensor([context]), cache, logits_rows=slice(-1, None))[0]
            dist = probabilities(logits, params, prompt, output)[0]
            prob *= float(dist[token])
            context.append(token)
            output.append(token)
            if prob == 0.0:
                break
        probs[tokens] = prob
    return probs


def chi_square_p_value(counts: Counter, expected_probs: dict, n: int) -> tuple[float, int]:
    """Goodness of fit; cells with expected count < 5 are pooled into one."""
    from scipy.stats import chisquare

    observed, expected = [], []
    pooled_obs, pooled_exp = 0, 0.0
    for cell, prob in expected_probs.items():
        if prob * n >= 5:
            observed.append(counts.get(cell, 0))
            expected.append(prob * n)
        else:
            pooled_obs += counts.get(cell, 0)
            pooled_exp += prob * n
    outside = n - sum(counts.get(cell, 0) for cell in expected_probs)
    assert outside == 0, f"{outside} samples fell outside the support of p_target"
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    total = sum(expected)
    expected = [e * sum(observed) / total for e in expected]
    return float(chisquare(observed, expected).pvalue), len(observed)


@pytest.mark.slow
@pytest.mark.parametrize("case", PROPOSER_CASES, ids=[c.name for c in PROPOSER_CASES])
def test_engine_samples_match_plain_sampling(case):
    samples = CORE_SAMPLES if case.name == "model" else OTHER_SAMPLES
    vocab = 4
    target = tiny_model(vocab=vocab, seed=10, hidden=16, layers=3)
    params_base = dict(temperature=0.9, top_k=3, max_tokens=CONTINUATION)
    expected = exact_continuations(target, SamplingParams(**params_base), PROMPT, CONTINUATION)
    engine = Engine(target, make_proposer(case, target, seed=11), k=2)
    counts: Counter = Counter()
    gen = torch.Generator().manual_seed(1234)
    seeds = torch.randint(0, 2**62, (samples,), generator=gen).tolist()
    drafted = accepted = 0
    for seed in seeds:
        result = engine.generate(PROMPT, SamplingParams(**params_base, seed=seed))
        counts[tuple(result.token_ids)] += 1
        drafted += result.stats.drafted
        accepted += result.stats.accepted
    p_value, cells = chi_square_p_value(counts, expected, samples)
    assert drafted > samples // 2, f"{case.name}: the proposer drafted only {drafted} tokens; the test would be vacuous"
    assert 0 < accepted < drafted, f"{case.name}: accepted {accepted} of {drafted}: both branches must be exercised"
    assert p_value > P_THRESHOLD, (
        f"{case.name}: speculative 3-token continuations differ from plain sampling: chi-square p = {p_value:.2e} "
        f"over {cells} cells and {samples} samples (threshold {P_THRESHOLD})"
    )
