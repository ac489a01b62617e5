"""Integration tests on the real models (pulled through the store on first use).

The Qwen2.5-Coder pair is the default target/draft; fp32 is used where the
test compares against transformers or needs exactness independent of the
batch-invariance padding, bf16 where it checks what users run.
"""

from __future__ import annotations

import pytest
import torch

from augury.models.tokenizer import build_prompt_ids
from augury.engine import Engine
from augury.models.loader import load_model
from augury.models.store import resolve
from augury.proposers.draft_model import DraftModelProposer
from augury.sampling import SamplingParams

pytestmark = [pytest.mark.real, pytest.mark.slow]

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Explain in two sentences what a hash map is.",
    "Translate to German: The weather is nice today and we are going to the park.",
]


@pytest.fixture(scope="module")
def draft_fp32():
    return load_model(DRAFT, dtype="fp32", weights="bf16")  # dequantized fp32


@pytest.fixture(scope="class")
def hf_draft_fp32():
    """transformers' own GGUF loader on the same file: an independent path to the same weights.

    Class-scoped, for TestAgainstTransformers only: freed before the fp32 pair loads.
    """
    from transformers import AutoModelForCausalLM

    path = resolve(DRAFT)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model.eval()


class TestAgainstTransformers:
    """The 0.5B against transformers' own model: a class, so that model is freed before the fp32 pair loads."""

    def test_real_logits_match_transformers(self, draft_fp32, hf_draft_fp32):
        ids = build_prompt_ids(draft_fp32.tokenizer, PROMPTS[0], chat=True)
        with torch.no_grad():
            ref = hf_draft_fp32(torch.tensor([ids])).logits.float()
        ours = draft_fp32.decoder.forward(torch.tensor([ids]), draft_fp32.decoder.new_cache(1, 256))
        rel = float((ours - ref).abs().max() / ref.abs().max())
        assert rel < 1e-4, f"relative error {rel:.2e} against transformers on the real 0.5B"

    def test_real_greedy_generation_matches_transformers(self, draft_fp32, hf_draft_fp32):
        for prompt in PROMPTS[:2]:
            ids = build_prompt_ids(draft_fp32.tokenizer, prompt, chat=True)
            ours = Engine(draft_fp32).generate(ids, SamplingParams(max_tokens=24, ignore_eos=True)).token_ids
            with torch.no_grad():
                out = hf_draft_fp32.generate(
                    torch.tensor([ids]), max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0
                )
            assert ours == out[0, len(ids) :].tolist(), f"greedy output differs from transformers for {prompt!r}"


@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma-3-270m"])
def test_real_small_models_match_transformers(name):
    """llama (q/k un-permuted from llama.cpp's layout) and gemma3 (norms, sliding window) on real files."""
    from transformers import AutoModelForCausalLM

    ours = load_model(name, dtype="fp32", weights="bf16")  # dequantized, as transformers reads the file
    path = resolve(name)
    ref_model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    text = "The quick brown fox jumps over the lazy dog. " * 3
    ids = ours.tokenizer.encode(text)
    with torch.no_grad():
        ref = ref_model.eval()(torch.tensor([ids])).logits.float()
    logits = ours.decoder.forward(torch.tensor([ids]), ours.decoder.new_cache(1, 256))
    rel = float((logits - ref).abs().max() / ref.abs().max())
    assert rel < 1e-3, f"{name}: relative error {rel:.2e} against transformers"


@pytest.fixture(scope="module")
def pair_fp32():
    """Both models on their GGUF blocks with fp32 activations (the native layer): the dequantized fp32 pair
    held 8 GB and took minutes per K; the torch layer's fp32 batch invariance is tested in test_decoder.py."""
    return load_model(TARGET, dtype="fp32"), load_model(DRAFT, dtype="fp32")


@pytest.mark.parametrize("k", [1, 2, 4, 8])
def test_real_pair_speculative_greedy_equals_plain_fp32(pair_fp32, k):
    target, draft = pair_fp32
    params = SamplingParams(max_tokens=64)
    for prompt in PROMPTS[:2]:
        ids = build_prompt_ids(target.tokenizer, prompt, chat=True)
        plain = _plain_cached(target, ids, params)
        spec = Engine(target, DraftModelProposer(draft, target.config.vocab_size), k=k).generate(ids, params)
        assert spec.token_ids == plain, f"K={k}: speculative output differs from plain greedy for {prompt!r}"
        assert spec.stats.tau > 1.5, f"K={k}: tau {spec.stats.tau:.2f} is implausibly low for this pair"


_PLAIN: dict = {}


def _plain_cached(model, ids, params):
    key = (id(model), tuple(ids), params)
    if key not in _PLAIN:
        _PLAIN[key] = Engine(model).generate(ids, params).token_ids
    return _PLAIN[key]


def test_real_pair_bf16_speculative_equals_plain():
    target, draft = load_model(TARGET), load_model(DRAFT)
    params = SamplingParams(max_tokens=64)
    for prompt in PROMPTS:
        ids = build_prompt_ids(target.tokenizer, prompt, chat=True)
        plain = Engine(target).generate(ids, params)
        spec = Engine(target, DraftModelProposer(draft, target.config.vocab_size), k=4).generate(ids, params)
        assert spec.token_ids == plain.token_ids, f"bf16 speculative output differs from plain for {prompt!r}"
