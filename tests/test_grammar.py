"""response_format json_object: the grammar mask, applied alike to p_target and q_draft, stays lossless."""

from __future__ import annotations

import collections
import json

import pytest
import torch
from scipy import stats as scipy_stats

from augury.engine import Engine
from augury.grammar import START, JsonMachine, JsonObjectConstraint
from augury.proposers.draft_model import DraftModelProposer
from augury.proposers.ngram import NgramProposer
from augury.sampling import SamplingParams, probabilities
from tests.tiny import CharTokenizer, tiny_model


@pytest.mark.parametrize("text", [
    '{}', '{"a": 1}', '{"a":[1, -2.5e+3, true, null, {"b": "x\\\\y\\u00e9"}], "c": false}', '{ "k" :\n"v" }',
])
def test_valid_objects_are_accepted_character_by_character(text):
    state = START
    for i, ch in enumerate(text):
        state = JsonMachine.step(state, ch)
        assert state is not None, f"rejected {text[: i + 1]!r}"
    assert JsonMachine.complete(state)
    json.loads(text)


@pytest.mark.parametrize("text", ['[]', '1', '{"a" 1}', '{"a": 01}', '{"a": tru}x', '{,}', '{"a":1}}', '{  }',
                                  '{"a": "\x01"}', '{"a": 1,}', ' {"a":1} x'])
def test_what_is_not_a_json_object_prefix_is_rejected(text):
    assert JsonMachine.feed(START, text) is None or not JsonMachine.complete(JsonMachine.feed(START, text)), text
    if text in ('[]', '1', '{"a" 1}', '{"a": 01}', '{,}', '{"a":1}}', '{  }', '{"a": "\x01"}', '{"a": 1,}'):
        assert JsonMachine.feed(START, text) is None, text


class JsonTokenizer(CharTokenizer):
    """Eight tokens, enough to write small JSON objects, and id 8 that ends the sequence."""

    ALPHABET = '{}":a1, \n'


def _json_model(seed: int, layers: int = 2):
    model = tiny_model(vocab=9, seed=seed, layers=layers, eos_id=8)
    model.tokenizer = JsonTokenizer(9, eos_id=8)
    return model


def _constraint(model) -> JsonObjectConstraint:
    return JsonObjectConstraint.for_tokenizer(model.tokenizer, 9)


def test_the_mask_allows_exactly_the_tokens_that_keep_a_valid_prefix():
    model = _json_model(0)
    c = _constraint(model)
    ids = {ch: i for i, ch in enumerate(JsonTokenizer.ALPHABET[:8])}
    assert c.allowed(c.state([])).nonzero().flatten().tolist() == [ids["{"], ids[" "]]
    after_key = c.state([ids["{"], ids['"'], ids["a"], ids['"']])
    assert c.allowed(after_key).nonzero().flatten().tolist() == [ids[":"], ids[" "]]
    done = c.state([ids["{"], ids["}"]])
    assert c.allowed(done).nonzero().flatten().tolist() == [8], "a complete object may only end"


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_constrained_greedy_speculation_equals_constrained_plain_and_stays_valid(drafter, k):
    target = _json_model(0)
    params = SamplingParams(max_tokens=60, constraint=_constraint(target))
    proposer = DraftModelProposer(_json_model(0, layers=1), 9) if drafter == "model" else NgramProposer(1, 3)
    ended = 0
    for prompt in ([0, 2, 4, 2, 3], [1, 1, 5], [6, 6, 6, 0]):
        plain = Engine(target).generate(prompt, params)
        spec = Engine(target, proposer, k=k).generate(prompt, params)
        assert spec.token_ids == plain.token_ids
        text = target.tokenizer.decode(plain.token_ids)
        assert JsonMachine.feed(START, text) is not None, f"not a JSON prefix: {text!r}"
        if plain.finish_reason == "stop":
            json.loads(text)
            ended += 1
    unconstrained = Engine(target).generate([0, 2, 4, 2, 3], SamplingParams(max_tokens=60))
    assert JsonMachine.feed(START, target.tokenizer.decode(unconstrained.token_ids)) is None, \
        "without the mask this model writes no JSON: the test would prove nothing"


@pytest.mark.slow
def test_constrained_sampling_with_a_drafter_is_distributed_as_constrained_plain_sampling():
    """Exact distribution of the first three tokens under the mask (enumerated from the target),
    against 6000 speculative samples with a sampled draft model: a chi-square test."""
    target, draft = _json_model(3), _json_model(5, layers=1)
    constraint = _constraint(target)
    base = SamplingParams(temperature=1.0, max_tokens=3, constraint=constraint, ignore_eos=True)
    prompt = [0, 2, 4, 2]

    def p_next(history: list[int]) -> torch.Tensor:
        cache = target.decoder.new_cache(1, 32)
        logits = target.decoder.forward(torch.tensor([prompt + history]), cache)[0, -1:]
        return probabilities(logits, base, prompt, history)[0].double()

    exact: dict[tuple[int, ...], float] = {}
    for a in range(9):
        pa = float(p_next([])[a])
        if pa == 0:
            continue
        pb_all = p_next([a])
        for b in range(9):
            if pb_all[b] == 0:
                continue
            pc_all = p_next([a, b])
            for c in range(9):
                if pc_all[c] > 0:
                    exact[(a, b, c)] = pa * float(pb_all[b]) * float(pc_all[c])
    assert abs(sum(exact.values()) - 1) < 1e-6 and len(exact) > 4
    counts: collections.Counter = collections.Counter()
    proposer = DraftModelProposer(draft, 9)
    engine = Engine(target, proposer, k=2)
    n = 6000
    for seed in range(n):
        params = SamplingParams(temperature=1.0, max_tokens=3, constraint=constraint, ignore_eos=True, seed=seed)
        counts[tuple(engine.generate(prompt, params).token_ids)] += 1
    assert set(counts) <= set(exact), f"sampled a sequence the grammar forbids: {set(counts) - set(exact)}"
    keys = sorted(exact)
    observed = [counts[key] for key in keys]
    expected = [exact[key] * n for key in keys]
    # pool rare cells so the chi-square approximation holds
    rare = [i for i, e in enumerate(expected) if e < 5]
    obs = [o for i, o in enumerate(observed) if i not in rare] + [sum(observed[i] for i in rare)]
    exp = [e for i, e in enumerate(expected) if i not in rare] + [sum(expected[i] for i in rare)]
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    total = sum(exp)
    p = scipy_stats.chisquare(obs, [e * sum(obs) / total for e in exp]).pvalue
    assert p > 1e-3, f"speculative constrained sampling differs from constrained plain sampling (p = {p:.2e})"
