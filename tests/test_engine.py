"""The engine loop: greedy equivalence for every proposer, stopping rules, statistics, bad input."""

from __future__ import annotations

import pytest
import torch

from augury.engine import Engine, check_k
from augury.errors import AuguryError
from augury.proposers.draft_model import DraftModelProposer
from augury.proposers.draft_model_build import check_same_vocabulary
from augury.sampling import SamplingParams
from tests.proposer_cases import PROPOSER_CASES, make_proposer
from tests.tiny import CharTokenizer, tiny_model

VOCAB = 24
PROMPTS = [
    [1, 2, 3, 4, 5, 1, 2, 3],
    [7, 7, 8, 9, 10, 11, 7, 7, 8],
    [0, 5, 10, 15, 20, 5, 10],
]


@pytest.fixture(scope="module")
def target():
    return tiny_model(vocab=VOCAB, seed=3, hidden=32, layers=3)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("case", PROPOSER_CASES, ids=[c.name for c in PROPOSER_CASES])
def test_greedy_speculative_equals_plain(case, k, target):
    params = SamplingParams(max_tokens=40)
    proposer = make_proposer(case, target)
    drafted = 0
    for prompt in PROMPTS:
        plain = Engine(target).generate(prompt, params)
        spec = Engine(target, proposer, k=k).generate(prompt, params)
        assert spec.token_ids == plain.token_ids, f"{case.name} K={k}: speculative greedy output differs from plain"
        assert spec.stats.steps < plain.stats.steps or spec.stats.accepted == 0
        assert len(spec.token_ids) == 40
        drafted += spec.stats.drafted
    assert drafted > 0, f"{case.name} K={k} never drafted: the equality above proved nothing"


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_draft_equal_to_target_accepts_everything(k, target):
    proposer = DraftModelProposer(target, VOCAB)
    result = Engine(target, proposer, k=k).generate(PROMPTS[0], SamplingParams(max_tokens=1 + 5 * (k + 1)))
    stats = result.stats
    assert stats.alpha == 1.0
    assert stats.tau == k + 1
    assert stats.acceptance_by_position == [1.0] * k
    assert stats.steps == 5
    assert stats.target_forwards == 6  # prefill + 5 verification forwards


def _plain_tokens(model, prompt, n):
    return Engine(model).generate(prompt, SamplingParams(max_tokens=n, ignore_eos=True)).token_ids


def test_eos_inside_an_accepted_block_stops_exactly_like_plain():
    probe = tiny_model(vocab=VOCAB, seed=3, hidden=32, layers=2)
    tokens = _plain_tokens(probe, PROMPTS[1], 30)
    # the first token that appears at index >= 6 and not before: it becomes EOS
    index = next(i for i in range(6, 30) if tokens[i] not in tokens[:i])
    eos = tokens[index]
    model = tiny_model(vocab=VOCAB, seed=3, hidden=32, layers=2, eos_id=eos)
    plain = Engine(model).generate(PROMPTS[1], SamplingParams(max_tokens=30))
    spec = Engine(model, DraftModelProposer(model, VOCAB), k=8).generate(PROMPTS[1], SamplingParams(max_tokens=30))
    assert plain.token_ids == tokens[:index] and plain.finish_reason == "stop"
    assert spec.token_ids == plain.token_ids and spec.finish_reason == "stop"
    assert spec.text == plain.text


def test_stop_string_inside_an_accepted_block():
    model = tiny_model(vocab=VOCAB, seed=3, hidden=32, layers=2)
    tokens = _plain_tokens(model, PROMPTS[2], 30)
    text = model.tokenizer.decode(tokens)
    stop = text[9:11]
    cut = text.find(stop)
    params = SamplingParams(max_tokens=30, stop=(stop,))
    chunks = []
    plain = Engine(model).generate(PROMPTS[2], params)
    spec = Engine(model, DraftModelProposer(model, VOCAB), k=8).generate(PROMPTS[2], params, on_text=chunks.append)
    assert plain.text == text[:cut] and plain.finish_reason == "stop"
    assert spec.text == plain.text and spec.finish_reason == "stop"
    assert "".join(chunks) == spec.text, "streamed text must equal the final text (stop string held back)"


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 10])
def test_max_tokens_is_exact_inside_accepted_blocks(max_tokens):
    model = tiny_model(vocab=VOCAB, seed=3, hidden=32, layers=2)
    params = SamplingParams(max_tokens=max_tokens)
    spec = Engine(model, DraftModelProposer(model, VOCAB), k=4).generate(PROMPTS[0], params)
    plain = Engine(model).generate(PROMPTS[0], params)
    assert len(spec.token_ids) == max_tokens and spec.finish_reason == "length"
    assert spec.token_ids == plain.token_ids


def test_streamed_text_concatenates_to_the_result(target):
    chunks = []
    draft = tiny_model(vocab=VOCAB, seed=4, hidden=32)
    result = Engine(target, DraftModelProposer(draft, VOCAB), k=3).generate(
        PROMPTS[0], SamplingParams(max_tokens=25), on_text=chunks.append
    )
    assert len(chunks) > 1
    assert "".join(chunks) == result.text == target.tokenizer.decode(result.token_ids)


def test_seeded_sampling_is_reproducible(target):
    draft = tiny_model(vocab=VOCAB, seed=4, hidden=32)
    runs = []
    for _ in range(2):
        engine = Engine(target, DraftModelProposer(draft, VOCAB), k=3)
        runs.append(engine.generate(PROMPTS[0], SamplingParams(temperature=1.0, seed=7, max_tokens=30)).token_ids)
    other = Engine(target, DraftModelProposer(draft, VOCAB), k=3).generate(
        PROMPTS[0], SamplingParams(temperature=1.0, seed=8, max_tokens=30)
    )
    assert runs[0] == runs[1]
    assert other.token_ids != runs[0]


def test_statistics_add_up(target):
    draft = tiny_model(vocab=VOCAB, seed=4, hidden=32)
    stats = Engine(target, DraftModelProposer(draft, VOCAB), k=4).generate(PROMPTS[0], SamplingParams(max_tokens=30)).stats
    assert stats.generated_tokens == 30 and stats.drafted > 0
    assert stats.generated_tokens == 1 + stats.committed_in_steps  # prefill gives the first token, no truncation here
    assert sum(stats.accepted_at) == stats.accepted and sum(stats.drafted_at) == stats.drafted
    assert stats.draft_forwards >= stats.drafted
    assert stats.total_s >= stats.prefill_s + stats.draft_s
    assert 0 <= stats.alpha <= 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(temperature=-0.1), "temperature"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_k=-1), "top_k"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(min_p=2.0), "min_p"),
        (dict(temperature=float("nan")), "temperature must be a finite"),
        (dict(temperature=float("inf")), "temperature must be a finite"),
        (dict(repetition_penalty=float("inf")), "repetition_penalty must be a finite"),
    ],
)
def test_bad_sampling_parameters_are_refused(kwargs, message):
    with pytest.raises(AuguryError, match=message):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=1e-40),
        dict(temperature=5e-324),
        dict(temperature=1e300),
        dict(temperature=1.0, repetition_penalty=1e-30),
        dict(temperature=1e-30, repetition_penalty=1e30, frequency_penalty=2.0, top_p=1e-9, min_p=1.0),
    ],
)
def test_extreme_valid_sampling_settings_still_give_a_distribution(kwargs):
    """Overflow inside the sampling transform must never reach the sampler as inf or NaN (it crashed
    a request before: found by the server's schema fuzz)."""
    from augury.sampling import probabilities

    params = SamplingParams(**kwargs)
    logits = torch.tensor([[3.0, -2.0, 50.0, 0.5, 50.0], [1e30, -1e30, 0.0, 2.0, -3.0]])
    probs = probabilities(logits, params, prompt=[0, 2], output=[2, 3], drafted=[4])
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    torch.testing.assert_close(probs.sum(-1), torch.ones(2))
    if params.greedy and not params.has_penalties:  # below sampling.GREEDY_BELOW: greedy, the first argmax
        torch.testing.assert_close(probs, torch.tensor([[0, 0, 1.0, 0, 0], [1.0, 0, 0, 0, 0]]))


@pytest.mark.parametrize("k", [0, -1, 33, 1000])
def test_bad_k_is_refused(k):
    with pytest.raises(AuguryError, match="between 1 and"):
        check_k(k)


def test_prompt_longer_than_context_is_refused(target):
    with pytest.raises(AuguryError, match="context"):
        Engine(target).generate([1] * 600, SamplingParams(max_tokens=4))
    with pytest.raises(AuguryError, match="max_tokens"):
        Engine(target).generate([1] * 10, SamplingParams(max_tokens=600))


def test_draft_with_another_tokenizer_is_refused(target):
    other = tiny_model(vocab=VOCAB, seed=5)
    other.tokenizer = CharTokenizer(VOCAB)
    other.tokenizer.vocab = {c: VOCAB - 1 - i for c, i in other.tokenizer.vocab.items()}
    with pytest.raises(AuguryError, match="cross"):
        check_same_vocabulary(target, other)
    check_same_vocabulary(target, tiny_model(vocab=VOCAB, seed=6))  # same vocabulary: accepted


def test_bf16_speculative_greedy_is_bitwise_plain():
    """Batch-invariant padding makes bf16 verification logits equal one-token steps, so outputs match."""
    model = tiny_model(vocab=VOCAB, seed=3, hidden=64, layers=2, dtype=torch.bfloat16)
    draft = tiny_model(vocab=VOCAB, seed=4, hidden=64, dtype=torch.bfloat16)
    accepted = 0
    for prompt in PROMPTS:
        plain = Engine(model).generate(prompt, SamplingParams(max_tokens=40))
        spec = Engine(model, DraftModelProposer(draft, VOCAB), k=5).generate(prompt, SamplingParams(max_tokens=40))
        assert spec.token_ids == plain.token_ids
        accepted += spec.stats.accepted
    assert accepted > 0, "no draft was accepted: only the first row of each block was compared with plain decoding"
