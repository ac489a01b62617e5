"""A real model's sampled speculative output, distributed exactly as its plain sampling (slow tier).

The tiny-model batteries (test_exact, test_lossless) prove the verifier and
every drafter on vocabularies small enough to enumerate. This runs the same
check where the arithmetic is real: the 0.5B on its GGUF blocks drafting for
itself with four of its 24 layers skipped (the layer-skip self-drafter, whose
q_draft really differs from p_target), K = 2, T = 0.7, top-p 0.9, rejection
sampling, 16 requests sharing each step through the drivers' own `draft` and
`step`. The first three output tokens (the prefill's and the first two that
verification commits) are compared with plain decoding's exact distribution,
enumerated with the plain path's own forwards (a prefill, then one-token
steps), by a chi-square at N >= 10000 samples (AUGURY_REAL_CHI_SAMPLES).

Every request has the same prompt, so its prefill runs once, alone, and each
request's cache row starts from a copy of it: the drawn first token and
everything after it are each request's own.
"""

from __future__ import annotations

import os

import pytest
import torch

from augury.models.loader import load_model
from augury.proposers import build_proposer
from augury.sampling import SamplingParams, probabilities
from augury.request import GenerationResult, Request
from augury.sampling import draw
from augury.step import draft, step
from tests.test_lossless import check_samples

pytestmark = [pytest.mark.real, pytest.mark.slow]

MODEL = "qwen2.5-coder-0.5b-instruct"
PROMPT = "My favourite animal is the"  # an open continuation: several tokens in each nucleus
LENGTH = 3  # output tokens compared: the prefill's, then two committed by verification
K = 2
SETTING = dict(temperature=0.7, top_p=0.9, ignore_eos=True)
SKIP_LAYERS = "8,10,12,14"
BATCH = 16
MAX_ENUMERATED = 2000  # forwards the exact distribution may take before the prompt is judged too open


def samples() -> int:
    return int(os.environ.get("AUGURY_REAL_CHI_SAMPLES", 10_000))


def plain_distribution(model, prompt: list[int], params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(first LENGTH output tokens) under plain sampling, enumerated over every nucleus.

    Each path runs as plain decoding does (one prefill, then one-token steps on
    its cache), so every probability is the one plain decoding samples from.
    """
    decoder = model.decoder
    out: dict[tuple[int, ...], float] = {}
    forwards = 0

    def expand(tokens: list[int], prob: float) -> None:
        nonlocal forwards
        cache = decoder.new_cache(1, len(prompt) + LENGTH + 8)
        logits = decoder.forward(torch.tensor([prompt]), cache, logits_rows=slice(-1, None))
        for token in tokens:
            logits = decoder.forward(torch.tensor([[token]]), cache)
        forwards += len(tokens) + 1
        assert forwards <= MAX_ENUMERATED, f"the nucleus tree under {PROMPT!r} took over {MAX_ENUMERATED} forwards"
        p_target = probabilities(logits[0, -1:].float(), params, prompt, tokens)[0].double()
        for token in torch.nonzero(p_target).flatten().tolist():
            branch = prob * float(p_target[token])
            if len(tokens) + 1 == LENGTH:
                out[(*tokens, token)] = branch
            else:
                expand([*tokens, token], branch)

    expand([], 1.0)
    return out


def speculative_samples(target, proposer, prompt: list[int], params: list[SamplingParams]) -> list[GenerationResult]:
    """Each params' first LENGTH output tokens, BATCH requests sharing every draft and step.

    The prompt is prefilled once, alone, as plain decoding prefills it; every
    request's cache row starts as a copy of those keys and values, and its
    first token is drawn from that forward's p_target with its own generator.
    """
    decoder = target.decoder
    alone = decoder.new_cache(1, len(prompt))
    logits = decoder.forward(torch.tensor([prompt]), alone, logits_rows=slice(-1, None))
    keys, values = alone.copy_rows(0, 0, len(prompt))
    results = []
    for start in range(0, len(params), BATCH):
        group = [Request(target, prompt, p, proposer) for p in params[start : start + BATCH]]
        cache = decoder.new_cache(len(group), len(prompt) + LENGTH + 2 * K + 8)
        for b, request in enumerate(group):  # the prefill's token, drawn as `step.prefill` draws it
            cache.fill(b, keys, values)
            seq = request.seq
            p_target = probabilities(logits[0, -1:], request.params, seq.prompt, seq.output)
            request.commit([draw(p_target[0], seq, position=0)])
        while any(len(r.seq.output) < LENGTH for r in group):
            draft(proposer, group, [K] * len(group))
            report = step(target, group, cache)
            assert not report.failures, report.failures
        for request in group:
            request.close()
            results.append(request.result())
    return results


def test_real_self_draft_samples_match_plain_sampling():
    target = load_model(MODEL)
    proposer = build_proposer("layerskip", target, skip_layers=SKIP_LAYERS)
    prompt = target.tokenizer.encode(PROMPT)
    n = samples()
    expected = plain_distribution(target, prompt, SamplingParams(**SETTING))
    assert abs(sum(expected.values()) - 1.0) < 1e-6
    seeds = torch.randint(0, 2**62, (n,), generator=torch.Generator().manual_seed(2026)).tolist()
    params = [SamplingParams(**SETTING, max_tokens=LENGTH + 1, seed=seed, coupling="rejection") for seed in seeds]
    results = speculative_samples(target, proposer, prompt, params)
    check_samples(f"{MODEL} drafting for itself (layers {SKIP_LAYERS} skipped), T=0.7 top-p 0.9, K={K}",
                  results, expected, LENGTH)
