"""Coupled (seeded) sampling: the noise for output position t depends on (seed, t) alone.

What must hold (see verify.py):
- coupled sampling is distributed exactly as p_target over seeds, one token
  and whole sequences (chi-square against the enumerated plain distribution);
- verify_coupled commits exactly the tokens plain coupled sampling commits,
  for any p_target and any draft (a property test over random cases);
- so a seeded output is the same token for token with or without speculation,
  for every drafter and K, with temperature, top-p and penalties (a table
  model driven step by step the way the engine drives the target);
- a drafter drafting with the same noise is accepted with the exact
  probability of the Gumbel-max coupling, sum_i 1 / sum_j max(p_j / p_i, q_j / q_i),
  which is at least (1 - TV) / (1 + TV).
"""

from __future__ import annotations

import functools
import itertools
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from augury.sampling import SamplingParams, probabilities
from augury.verify import coupled_noise, coupled_sample, coupled_sample_reference, verify_coupled

VOCAB = 6
PROMPT = (3, 1, 4, 1)
P_THRESHOLD = 1e-3


def chi_square_p(counts: Counter, expected: dict, n: int) -> float:
    """Goodness of fit of counts to expected probabilities; cells expected < 5 times are pooled."""
    from scipy.stats import chisquare

    outside = [cell for cell in counts if expected.get(cell, 0.0) == 0.0]
    assert not outside, f"samples {outside[:3]} have probability 0"
    big = [cell for cell, prob in expected.items() if prob * n >= 5]
    small = [cell for cell, prob in expected.items() if 0 < prob * n < 5]
    observed = [counts.get(cell, 0) for cell in big] + ([sum(counts.get(c, 0) for c in small)] if small else [])
    want = [expected[cell] * n for cell in big] + ([sum(expected[c] for c in small) * n] if small else [])
    want = [w * n / sum(want) for w in want]
    return float(chisquare(observed, want).pvalue)


# -- the noise ------------------------------------------------------------------------------


def test_noise_is_a_function_of_seed_and_position_only():
    first = coupled_noise(7, 3, 1000)
    assert first.shape == (1000,) and first.dtype == torch.float64
    before = torch.get_rng_state()
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        torch.rand(5)  # other draws in between change nothing
        assert torch.equal(coupled_noise(7, 3, 1000), first)
    finally:
        torch.set_num_threads(threads)
    torch.set_rng_state(before)
    coupled_sample(torch.full((1000,), 1e-3), 7, 3)
    assert torch.equal(torch.get_rng_state(), before), "coupled sampling must not touch the global RNG"
    assert torch.equal(coupled_noise(7, 3, 1000, device="cpu"), first)
    others = [coupled_noise(8, 3, 1000), coupled_noise(7, 4, 1000), coupled_noise(-7, 3, 1000)]
    assert all(not torch.equal(other, first) for other in others), "another seed or position must get other noise"


def test_coupled_sample_of_a_one_hot_is_its_token():
    for seed in range(50):
        probs = torch.zeros(VOCAB)
        probs[seed % VOCAB] = 1.0
        assert coupled_sample(probs, seed, seed) == seed % VOCAB


def test_token_uniforms_are_splitmix64s_numbers_for_any_token_set():
    """Each token's number against splitmix64 in Python integers (so torch's int64 arithmetic wrapped as
    64-bit patterns do), for ids anywhere in a 152k vocabulary, whatever other ids are asked with it."""
    from augury.verify import _MASK64, _key, _mix64, token_uniforms

    ids = torch.tensor([0, 1, 2, 77, 4095, 65_535, 151_935, 2**31 + 5])
    for seed, position in ((0, 0), (7, 3), (-7, 3), (2**63 + 12345, 10_000)):
        key = _key(seed, position)
        want = [(_mix64((key + i * 0x9E3779B97F4A7C15) & _MASK64) >> 11) * 2.0**-53 for i in ids.tolist()]
        assert token_uniforms(seed, position, ids).tolist() == want
        alone = [float(token_uniforms(seed, position, ids[j : j + 1])[0]) for j in range(len(ids))]
        assert alone == want, "a token's number must not depend on the others asked with it"
    many = token_uniforms(3, 9, torch.arange(151_936))
    assert 0.0 <= float(many.min()) and float(many.max()) < 1.0
    assert abs(float(many.mean()) - 0.5) < 0.005 and abs(float(many.var()) - 1 / 12) < 0.002


@pytest.mark.parametrize("vocab", [VOCAB, 151_936])
def test_coupled_sample_on_the_support_is_the_whole_vocabularys_token(vocab):
    """The support-only draw against the whole-vocabulary reference: truncated rows of every shape (one
    token, a few, a nucleus, half the vocabulary, a full row, ties), many seeds and positions."""
    gen = torch.Generator().manual_seed(11)
    rows = []
    for kept in (1, 2, 7, 300, vocab // 2, vocab):
        probs = torch.softmax(torch.randn(vocab, generator=gen) * 2, -1)
        probs[probs.argsort(descending=True)[kept:]] = 0.0
        rows.append(probs / probs.sum())
    tied = torch.zeros(vocab)
    tied[torch.randperm(vocab, generator=gen)[:64]] = 1 / 64
    rows.append(tied)
    for r, probs in enumerate(rows):
        for seed, position in ((r, 0), (r + 100, 5), (2**40 + r, 77)):
            assert coupled_sample(probs, seed, position) == coupled_sample_reference(probs, seed, position), (
                f"row {r} ({int((probs > 0).sum())} tokens kept), seed {seed}, position {position}")
    with pytest.raises(ValueError, match="all zeros"):
        coupled_sample(torch.zeros(vocab), 1, 0)


def test_bad_positions_are_refused():
    with pytest.raises(ValueError, match="position"):
        coupled_noise(1, -1, 10)


# -- distributed as p_target ----------------------------------------------------------------


def random_distribution(gen: torch.Generator, vocab: int, zeros: int = 0) -> Tensor:
    """[vocab] probabilities with `zeros` tokens of probability 0."""
    probs = torch.rand(vocab, generator=gen) + 0.05
    probs[torch.randperm(vocab, generator=gen)[:zeros]] = 0.0
    return probs / probs.sum()


@pytest.mark.parametrize("samples", [30_000, pytest.param(300_000, marks=pytest.mark.slow)])
def test_coupled_sample_is_distributed_as_p(samples):
    probs = random_distribution(torch.Generator().manual_seed(0), VOCAB, zeros=1)
    counts = Counter(coupled_sample(probs, seed, 5) for seed in range(samples))
    expected = {token: float(probs[token]) for token in range(VOCAB)}
    p_value = chi_square_p(counts, expected, samples)
    assert p_value > P_THRESHOLD, f"coupled samples over {samples} seeds differ from p: chi-square p = {p_value:.2e}"


def table_logits(context: tuple[int, ...], model: int = 1) -> Tensor:
    """A fixed random 'model': logits [V] as a function of the whole context (model 1 the target, others drafters)."""
    gen = torch.Generator().manual_seed(hash((model,) + context) % (2**31))
    return torch.randn(VOCAB, generator=gen) * 1.5


SETTINGS = {
    "t0.7-topp0.9-penalties": SamplingParams(
        temperature=0.7, top_p=0.9, repetition_penalty=1.3, presence_penalty=0.4, frequency_penalty=0.3),
    "t1.0-topp0.9-penalties": SamplingParams(temperature=1.0, top_p=0.9, repetition_penalty=1.2, frequency_penalty=0.5),
    "t1.0": SamplingParams(temperature=1.0),
    "greedy": SamplingParams(temperature=0.0, repetition_penalty=1.3),
}


def p_plain(output: list[int], params: SamplingParams, model: int = 1) -> Tensor:
    """[V] the distribution plain decoding samples after PROMPT + output."""
    return _p_plain(tuple(output), params, model)


@functools.cache
def _p_plain(output: tuple[int, ...], params: SamplingParams, model: int) -> Tensor:
    return probabilities(table_logits(PROMPT + output, model)[None], params, list(PROMPT), list(output))[0]


def plain_coupled(params: SamplingParams, seed: int, length: int) -> list[int]:
    """Plain decoding with coupled sampling: position t gets coupled_sample(p_target, seed, t)."""
    output: list[int] = []
    for t in range(length):
        output.append(coupled_sample(p_plain(output, params), seed, t))
    return output


@pytest.mark.parametrize("length, samples", [(2, 20_000), pytest.param(3, 200_000, marks=pytest.mark.slow)])
def test_coupled_sequences_are_distributed_as_plain_sampling(length, samples):
    params = SETTINGS["t1.0-topp0.9-penalties"]
    expected: dict[tuple[int, ...], float] = {}
    for tokens in itertools.product(range(VOCAB), repeat=length):
        prob = 1.0
        for t in range(length):
            prob *= float(p_plain(list(tokens[:t]), params)[tokens[t]])
        expected[tokens] = prob
    counts = Counter(tuple(plain_coupled(params, seed, length)) for seed in range(samples))
    p_value = chi_square_p(counts, expected, samples)
    assert p_value > P_THRESHOLD, (
        f"coupled {length}-token sequences over {samples} seeds differ from plain sampling: chi-square p = {p_value:.2e}")


# -- verification commits what plain coupled sampling commits --------------------------------


def test_verify_coupled_commits_the_plain_coupled_tokens_for_any_draft():
    gen = torch.Generator().manual_seed(42)
    kinds = Counter()
    for case in range(600):
        vocab = int(torch.randint(2, 10, (1,), generator=gen))
        k = int(torch.randint(0, 6, (1,), generator=gen))
        seed = int(torch.randint(-(2**62), 2**62, (1,), generator=gen))
        start = int(torch.randint(0, 200, (1,), generator=gen))
        rows = [random_distribution(gen, vocab, zeros=int(torch.randint(0, vocab, (1,), generator=gen)))
                for _ in range(k + 1)]
        if case % 5 == 0:  # greedy rows
            rows = [torch.nn.functional.one_hot(row.argmax(), vocab).float() for row in rows]
        p_target = torch.stack(rows)
        plain = [coupled_sample(p_target[i], seed, start + i) for i in range(k + 1)]
        kind = case % 4
        if kind == 0:  # arbitrary tokens
            draft = torch.randint(0, vocab, (k,), generator=gen).tolist()
        elif kind == 1:  # what the target will commit: all accepted, then the bonus
            draft = plain[:k]
        elif kind == 2 and k:  # right up to one position, then wrong
            cut = int(torch.randint(0, k, (1,), generator=gen))
            draft = plain[:cut] + [(plain[cut] + 1) % vocab] + plain[cut + 1 : k]
        else:  # a drafter's coupled tokens from its own distribution
            draft = [coupled_sample(random_distribution(gen, vocab), seed, start + i) for i in range(k)]
        result = verify_coupled(draft, p_target, seed, start)
        n = result.num_accepted
        assert result.num_drafted == k and len(result.tokens) == n + 1
        assert draft[:n] == plain[:n], f"case {case}: accepted {draft[:n]}, plain coupled sampling gives {plain[:n]}"
        assert result.tokens == plain[: n + 1], f"case {case}: committed {result.tokens}, plain gives {plain[: n + 1]}"
        assert n == k or draft[n] != plain[n], f"case {case}: rejected a drafted token that plain sampling would commit"
        kinds[(kind, n == k)] += 1
    assert kinds[(1, True)] > 0 and kinds[(2, False)] > 0, "both the accept-all and the reject branch must run"


# -- the same seed gives the same text with any drafter and K ---------------------------------

Drafter = Callable[[list[int], int, SamplingParams, int], list[int]]


def coupled_drafter(model: int, seed_offset: int = 0) -> Drafter:
    """Drafts argmax(log q_draft + g_t) from table model `model`, with the request's noise (or another seed's)."""

    def draft(output: list[int], k: int, params: SamplingParams, seed: int) -> list[int]:
        tokens: list[int] = []
        for i in range(k):
            q_row = probabilities(table_logits(PROMPT + tuple(output + tokens), model)[None], params,
                                  list(PROMPT), output, tokens)[0]
            tokens.append(coupled_sample(q_row, seed + seed_offset, len(output) + i))
        return tokens

    return draft


def random_drafter(output: list[int], k: int, params: SamplingParams, seed: int) -> list[int]:
    gen = torch.Generator().manual_seed(len(output) * 1000 + k)
    return torch.randint(0, VOCAB, (k,), generator=gen).tolist()


def oracle_drafter(output: list[int], k: int, params: SamplingParams, seed: int) -> list[int]:
    """The target's own coupled tokens: every one is accepted."""
    tokens: list[int] = []
    for i in range(k):
        tokens.append(coupled_sample(p_plain(output + tokens, params), seed, len(output) + i))
    return tokens


DRAFTERS: dict[str, Drafter] = {
    "coupled-draft-model": coupled_drafter(model=2),
    "coupled-target-copy": coupled_drafter(model=1),
    "other-seed": coupled_drafter(model=2, seed_offset=1),
    "random": random_drafter,
    "oracle": oracle_drafter,
    "none": lambda output, k, params, seed: [],
}


def speculative_coupled(params: SamplingParams, seed: int, length: int, drafter: Drafter, k: int
                        ) -> tuple[list[int], int, int]:
    """Decode `length` tokens with drafts verified by verify_coupled, p_target rows built as the engine builds them.

    Returns (tokens, drafted, accepted).
    """
    output: list[int] = [coupled_sample(p_plain([], params), seed, 0)]  # the prefill's token: position 0
    drafted = accepted = 0
    while len(output) < length:
        draft = drafter(output, min(k, length - len(output) - 1), params, seed)
        rows = torch.stack([table_logits(PROMPT + tuple(output + draft[:i])) for i in range(len(draft) + 1)])
        p_target = probabilities(rows, params, list(PROMPT), output, draft)
        result = verify_coupled(draft, p_target, seed, len(output))
        output += result.tokens
        drafted += result.num_drafted
        accepted += result.num_accepted
    return output, drafted, accepted


@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("drafter", list(DRAFTERS))
def test_seeded_output_is_identical_with_any_drafter(drafter, k, setting):
    params = SETTINGS[setting]
    drafted = accepted = 0
    for seed in (0, 1, 2**40 + 3):
        plain = plain_coupled(params, seed, 16)
        spec, d, a = speculative_coupled(params, seed, 16, DRAFTERS[drafter], k)
        assert spec == plain, f"{drafter} K={k} {setting} seed {seed}: {spec} != plain coupled {plain}"
        drafted, accepted = drafted + d, accepted + a
    if drafter in ("oracle", "coupled-target-copy"):
        assert accepted == drafted > 0, f"{drafter} drafts the target's own coupled tokens: all must be accepted"


# -- acceptance: the coupling's exact agreement probability -----------------------------------


def coupled_agreement(p: Tensor, q: Tensor) -> float:
    """P(argmax(log p + g) == argmax(log q + g)) for Gumbel noise g, exactly.

    Both pick i iff every exponential E_j exceeds E_i * max(p_j / p_i, q_j / q_i);
    integrating over E_i gives 1 / sum_j max(p_j / p_i, q_j / q_i).
    """
    total = 0.0
    for i in range(p.shape[-1]):
        if p[i] > 0 and q[i] > 0:
            total += 1.0 / float(torch.maximum(p / p[i], q / q[i]).sum())
    return total


def test_coupled_drafts_are_accepted_at_the_coupling_rate():
    gen = torch.Generator().manual_seed(3)
    samples = 20_000
    for pair in range(4):
        p = random_distribution(gen, VOCAB, zeros=pair % 2).double()
        q = (0.6 * p + 0.4 * random_distribution(gen, VOCAB).double()) if pair < 2 else random_distribution(gen, VOCAB).double()
        exact = coupled_agreement(p, q)
        tv = 0.5 * float((p - q).abs().sum())
        assert exact >= (1 - tv) / (1 + tv) - 1e-12, f"agreement {exact:.4f} below (1 - TV) / (1 + TV) at TV {tv:.3f}"
        agree = sum(coupled_sample(p, seed, 9) == coupled_sample(q, seed, 9) for seed in range(samples))
        sigma = (exact * (1 - exact) / samples) ** 0.5
        assert abs(agree / samples - exact) < 5 * sigma, (
            f"pair {pair}: coupled drafts agreed {agree / samples:.4f} of the time, the coupling gives {exact:.4f} "
            f"(5 sigma = {5 * sigma:.4f})")
        print(f"TV {tv:.3f}: coupled acceptance {exact:.4f}, rejection sampling's 1 - TV {1 - tv:.4f}")
