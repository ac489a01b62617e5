"""Phi-3's long-context RoPE scaling (`longrope`, once `su`: the 128k variants), against transformers.

longrope divides each rotary frequency by one of two factor lists and multiplies cos and sin by an
attention factor. transformers picks the list by the current sequence length; augury's KV cache keeps
keys already rotated, so it picks once per loaded model by its context length, as llama.cpp does: the
long list past original_max_position_embeddings, else the short one. The tiny models (tests/tiny.py)
were pretrained on 32 positions: `phi3_longrope` is loaded for 64 (long list, factor
sqrt(1 + ln 2 / ln 32)) and is compared with transformers on 40 tokens, where transformers uses the long
list too; `phi3_longrope_4k` is loaded for 32 (short list) and compared on 13 tokens.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch

from augury.errors import AuguryError
from augury.kernels import extension as ext_module
from augury.models.attention import RopeTable
from augury.models.loader import load_model
from tests.gguf_files import VOCAB, private_home, write_hf_as_gguf
from tests.test_families import PHI3_TEMPLATE, transformers_tokenizer
from tests.tiny import hf_model, save_hf

LONG_TOKENS = torch.randint(0, VOCAB, (2, 40), generator=torch.Generator().manual_seed(1))  # past the 32 pretrained
SHORT_TOKENS = LONG_TOKENS[:, :13]
STEPS = {"phi3_longrope": (33, 34, 36, 40), "phi3_longrope_4k": (7, 8, 10, 13)}  # prompt end, then blocks of 1, 2, 3/4


@pytest.fixture(scope="module", autouse=True)
def _home(tmp_path_factory):
    yield from private_home(tmp_path_factory)


@pytest.fixture(scope="module", params=["phi3_longrope", "phi3_longrope_4k"])
def phi3(request, tmp_path_factory):
    """One tiny longrope model: transformers', its HF folder, an fp32 GGUF, a Q8_0 GGUF, and the tokens it is
    compared on (past the pretrained 32 positions for the long one)."""
    import gguf

    arch = request.param
    folder = tmp_path_factory.mktemp(arch)
    model = hf_model(arch)
    transformers_tokenizer(PHI3_TEMPLATE).save_pretrained(save_hf(model, folder / "hf"))
    return SimpleNamespace(
        arch=arch,
        model=model,
        hf=folder / "hf",
        f32=write_hf_as_gguf(folder / "f32.gguf", model),
        q8=write_hf_as_gguf(folder / "q8.gguf", model, quant=gguf.GGMLQuantizationType.Q8_0),
        tokens=LONG_TOKENS if arch == "phi3_longrope" else SHORT_TOKENS,
    )


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max() / ref.abs().max())


def reference_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens).logits.float()


def prompt_then_steps(decoder, tokens: torch.Tensor, bounds: tuple[int, ...]) -> torch.Tensor:
    """Logits [B, T, V]: a prompt up to bounds[0] (one masked call), then blocks up to each next bound (row by row)."""
    cache = decoder.new_cache(tokens.shape[0])
    chunks, lo = [], 0
    for hi in bounds:
        chunks.append(decoder.forward(tokens[:, lo:hi], cache))
        lo = hi
    return torch.cat(chunks, dim=1)


def test_loaders_choose_the_factor_list_by_the_context_and_the_attention_factor(tmp_path):
    """The long list and sqrt(1 + ln(64 / 32) / ln 32) for the model loaded for 64 positions, the short list and 1
    for the one loaded for 32, from the HF folder and the GGUF alike."""
    from augury.models import gguf, hf

    for arch, kind, factor in (("phi3_longrope", "long_factor", math.sqrt(1 + math.log(2) / math.log(32))),
                               ("phi3_longrope_4k", "short_factor", 1.0)):
        model = hf_model(arch)
        expected = tuple(model.config.rope_parameters[kind])
        folder = save_hf(model, tmp_path / arch)
        path = write_hf_as_gguf(tmp_path / f"{arch}.gguf", model)
        for config in (hf.read_config(folder), gguf.read_config(gguf.open_gguf(path), path)):
            assert config.rope_freq_factors == pytest.approx(expected), f"{arch}: not the {kind} list"
            assert config.rope_attn_factor == pytest.approx(factor, rel=1e-6), f"{arch}: attention factor"


CONFIG_VARIANTS = {
    "transformers 5 (rope_parameters)": {},
    "the 128k release's config.json (rope_scaling, type longrope)": {"old_format": True},
    "an explicit attention_factor": {"attention_factor": 1.25},
}


@pytest.mark.parametrize("variant", list(CONFIG_VARIANTS))
@pytest.mark.parametrize("arch", ["phi3_longrope", "phi3_longrope_4k"])
def test_rope_table_equals_transformers_rotary_embedding(arch, variant, tmp_path):
    """augury's cos/sin table for the config as written to disk equals Phi3RotaryEmbedding's at a length on the
    side of the 32 pretrained positions that the loaded context picks (transformers' list is then the same one)."""
    import transformers
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    from augury.models import hf

    change = CONFIG_VARIANTS[variant]
    cfg = hf_model(arch).config.to_dict()
    rope = dict(cfg.pop("rope_parameters"))
    if change.get("old_format"):
        rope = {"type": "longrope", "short_factor": rope["short_factor"], "long_factor": rope["long_factor"]}
        cfg.update(rope_scaling=rope, rope_theta=10000.0)
    else:
        cfg["rope_parameters"] = {**rope, **{k: v for k, v in change.items() if k != "old_format"}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    ours = RopeTable.scaled(hf.read_config(tmp_path), torch.float32, torch.device("cpu"))
    theirs = Phi3RotaryEmbedding(transformers.Phi3Config.from_pretrained(tmp_path))
    length = 40 if arch == "phi3_longrope" else 32
    positions = torch.arange(length)[None]
    cos, sin = theirs(torch.zeros(1, length, 16), positions)
    our_cos, our_sin = ours.lookup(positions)
    assert theirs.attention_scaling == pytest.approx(ours.attn_factor, rel=1e-6)
    err = max(float((our_cos[:, 0] - cos).abs().max()), float((our_sin[:, 0] - sin).abs().max()))
    assert err < 1e-5, f"{arch} ({variant}): cos/sin off transformers' by {err:.2e}"


def test_hf_folder_logits_equal_transformers(phi3):
    """fp32 within 1e-4 of transformers, for the prompt path and the row-by-row path."""
    model = load_model(str(phi3.hf), dtype="fp32", progress=False)
    ref = reference_logits(phi3.model, phi3.tokens)
    whole = model.decoder.forward(phi3.tokens, model.decoder.new_cache(2))
    assert rel_err(whole, ref) < 1e-4, f"{phi3.arch} prompt: relative error {rel_err(whole, ref):.2e}"
    steps = prompt_then_steps(model.decoder, phi3.tokens, STEPS[phi3.arch])
    assert rel_err(steps, ref) < 1e-4, f"{phi3.arch} steps: relative error {rel_err(steps, ref):.2e}"


def test_gguf_logits_equal_transformers(phi3):
    """llama.cpp's layout (rope_factors_long/short tensors, original_context_length, attn_factor) read back."""
    model = load_model(str(phi3.f32), dtype="fp32", weights="bf16", progress=False)
    ref = reference_logits(phi3.model, phi3.tokens)
    steps = prompt_then_steps(model.decoder, phi3.tokens, STEPS[phi3.arch])
    assert rel_err(steps, ref) < 1e-4, f"{phi3.arch}: relative error {rel_err(steps, ref):.2e}"


def test_the_long_list_is_used_from_the_first_token(tmp_path):
    """Chosen once: a model loaded for 64 positions rotates a 13-token prompt with the long list, so its logits are
    transformers' first 13 of a 40-token forward (long list), not those of a 13-token one (short list), and the
    keys in the cache stay right as the sequence passes the 32 pretrained positions."""
    model = hf_model("phi3_longrope")
    folder = save_hf(model, tmp_path / "hf")
    transformers_tokenizer(PHI3_TEMPLATE).save_pretrained(folder)
    ours = load_model(str(folder), dtype="fp32", progress=False).decoder
    logits = ours.forward(SHORT_TOKENS, ours.new_cache(2))
    long_ref = reference_logits(model, LONG_TOKENS)[:, :13]
    short_ref = reference_logits(model, SHORT_TOKENS)
    assert rel_err(logits, long_ref) < 1e-4, f"not the long list: {rel_err(logits, long_ref):.2e}"
    assert rel_err(logits, short_ref) > 1e-2, "transformers' short-list logits: the two lists were not told apart"


def test_the_native_path_reads_the_scaled_table(phi3):
    """Q8_0 blocks on the C++ layer, which takes cos and sin (divisors and attention factor) from the same table:
    within tests/test_native_layer.py's BOUND of the torch layer on the same blocks, and within
    test_families.py's 5% of the file dequantized (the kernel's int8 activations)."""
    from augury.models.decoder import Decoder
    from tests.test_native_layer import BOUND

    if ext_module.extension() is None:
        pytest.skip("the GGUF kernel extension cannot be built here")
    native = load_model(str(phi3.q8), dtype="fp32", weights="gguf", progress=False)
    d = native.decoder
    assert d.native is not None, "the C++ layer did not run"
    assert d.native.rope_global.attn_factor == native.config.rope_attn_factor
    ours = prompt_then_steps(d, phi3.tokens, STEPS[phi3.arch])
    torch_layer = prompt_then_steps(Decoder(d.config, d.weights, native=False, padding=d.padding), phi3.tokens,
                                    STEPS[phi3.arch])
    err = float((ours - torch_layer).abs().max()) / float(torch_layer.abs().max())
    assert err < BOUND, f"{phi3.arch}: the C++ layer is off the torch layer by {err:.2e} of the largest logit"
    dequantized = load_model(str(phi3.q8), dtype="fp32", weights="bf16", progress=False)
    ref = prompt_then_steps(dequantized.decoder, phi3.tokens, STEPS[phi3.arch])
    err = float((ours - ref).abs().max()) / float(ref.abs().max())
    print(f"{phi3.arch}: native {err:.4f} of the largest logit off the dequantized file")
    assert 0 < err < 0.05, f"{phi3.arch}: native logits off by {err:.2%} of the largest logit"


def test_bad_longrope_input_is_one_clear_error(tmp_path):
    """A factor list of the wrong length (HF) and a GGUF with only one of the two lists: one line each."""
    from augury.models import hf

    cfg = hf_model("phi3_longrope").config.to_dict()
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "long_factor": [1.0] * 5}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(AuguryError, match=r"longrope long_factor must be 8 positive numbers"):
        hf.read_config(tmp_path)
    path = write_hf_as_gguf(tmp_path / "short-only.gguf", hf_model("phi3_longrope"), drop=("rope_factors_long.weight",))
    with pytest.raises(AuguryError, match=r"short-only\.gguf: longrope long_factor must be 8 positive numbers"):
        load_model(str(path), dtype="fp32", progress=False)
