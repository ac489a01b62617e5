"""Loading a GGUF's own blocks (weights="gguf"): tiny files written here, compared with the dequantized path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from augury.errors import AuguryError
from augury.kernels import extension as ext_module
from augury.kernels.weight import GgufWeight
from augury.models.loader import load_model
from tests.gguf_files import MIXED_HIDDEN as HIDDEN
from tests.gguf_files import MIXED_TYPES as TYPES
from tests.gguf_files import MIXED_VOCAB as VOCAB
from tests.gguf_files import write_mixed_gguf as write_gguf

PROMPT = [5, 17, 33, 2, 61, 40, 40, 9, 77, 12]


@pytest.fixture(scope="module", autouse=True)
def _kernel_built_once():
    """Build (or find) the extension under the real home before tests point AUGURY_HOME at temporary folders."""
    if ext_module.extension() is None:
        pytest.skip("the GGUF kernel extension cannot be built here")


def _load(path: Path, home: Path, monkeypatch, **kw):
    monkeypatch.setenv("AUGURY_HOME", str(home))
    return load_model(str(path), progress=False, **kw)


def _logits(model, tokens: list[int] = PROMPT) -> torch.Tensor:
    decoder = model.decoder
    return decoder.forward(torch.tensor([tokens]), decoder.new_cache(1, 64)).float()


def _matmuls(model) -> list:
    w = model.decoder.weights
    return [m for layer in w.layers for m in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)] + [w.lm_head]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_native_blocks_give_the_dequantized_models_logits(arch, tmp_path, monkeypatch):
    """Native fp32-activation logits stay within 3% (of the largest logit) of the fp32 dequantized model's.

    The only difference is the kernel's int8 rounding of activations (each
    matmul within reference.error_bound, tested in test_kernels.py), which
    this random model amplifies to 1.4-1.5% through two layers. With bf16
    activations (the default) the bound is 5%. A wrong block order (say, q/k
    rows of llama not un-permuted as whole block rows) gives errors of order 1.
    """
    path = write_gguf(tmp_path / "tiny.gguf", arch)
    exact = _load(path, tmp_path / "home", monkeypatch, dtype="fp32", weights="bf16")
    native32 = _load(path, tmp_path / "home", monkeypatch, dtype="fp32", weights="gguf")
    native16 = _load(path, tmp_path / "home", monkeypatch, dtype="bf16", weights="gguf")
    assert all(isinstance(m, GgufWeight) for m in _matmuls(native32))
    assert native16.decoder.weights.layers[0].wqkv.kinds == ["Q4_K", "Q4_K", "Q6_K"]
    assert native16.decoder.weights.layers[1].w_down.kinds == ["Q8_0"]
    ref = _logits(exact)
    scale = float(ref.abs().max())
    err32 = float((_logits(native32) - ref).abs().max()) / scale
    err16 = float((_logits(native16) - ref).abs().max()) / scale
    print(f"{arch}: native fp32 {err32:.4f}, native bf16 {err16:.4f} of the largest logit")
    assert 0 < err32 < 0.03, f"native fp32 logits off by {err32:.2%} of the largest logit"
    assert err16 < 0.05, f"native bf16 logits off by {err16:.2%} of the largest logit"


def test_native_memory_is_about_the_file_and_the_cache_reloads_bitwise(tmp_path, monkeypatch):
    import gguf

    path = write_gguf(tmp_path / "tiny.gguf")
    first = _load(path, tmp_path / "home", monkeypatch, weights="gguf")
    block_bytes = sum(int(t.n_bytes) for t in gguf.GGUFReader(str(path)).tensors if t.tensor_type.name in TYPES.values()
                      and t.name != "token_embd.weight")
    held = sum(m.nbytes for m in _matmuls(first))
    assert block_bytes <= held < 1.05 * block_bytes, f"{held} bytes held for {block_bytes} bytes of blocks"
    assert list((tmp_path / "home" / "converted").glob("*/native-*.safetensors"))
    again = _load(path, tmp_path / "home", monkeypatch, weights="gguf")
    assert torch.equal(_logits(again), _logits(first))


def test_tied_head_multiplies_the_embedding_blocks(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "tied.gguf", tied=True)
    model = _load(path, tmp_path / "home", monkeypatch, weights="gguf")
    head = model.decoder.weights.lm_head
    assert isinstance(head, GgufWeight) and head.kinds == ["Q4_K"] and head.shape == (VOCAB, HIDDEN)
    embed = model.decoder.weights.embed
    assert torch.equal(head.dense(), embed), "the embedding copy and the head are the same blocks"


def test_row_padding_is_off_where_every_matmul_is_native(tmp_path, monkeypatch):
    path = write_gguf(tmp_path / "tiny.gguf")
    model = _load(path, tmp_path / "home", monkeypatch, weights="gguf")
    assert model.decoder.pad_rows(1) == 1 and model.decoder.pad_rows(5) == 5, "calibration finds no padding needed"


K_VALUES = [1, 2, 4, 8]
CASES = ["ngram", "suffix", "model", "layerskip", "quantized"]


@pytest.fixture(scope="module")
def native_target(tmp_path_factory):
    import os

    folder = tmp_path_factory.mktemp("native")
    path = write_gguf(folder / "tiny.gguf", "qwen2")
    before = os.environ.get("AUGURY_HOME")
    os.environ["AUGURY_HOME"] = str(folder / "home")
    try:
        return load_model(str(path), progress=False, weights="gguf")
    finally:
        if before is None:
            del os.environ["AUGURY_HOME"]
        else:
            os.environ["AUGURY_HOME"] = before


def _assert_greedy_speculation_is_plain(target, case: str, k: int) -> None:
    from augury.engine import Engine
    from augury.sampling import SamplingParams
    from tests.proposer_cases import PROPOSER_CASES, make_proposer

    (spec_case,) = [c for c in PROPOSER_CASES if c.name == case]
    proposer = make_proposer(spec_case, target)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    drafted = 0
    for prompt in (PROMPT, [3, 4, 5, 3, 4, 5, 3, 4]):
        plain = Engine(target).generate(prompt, params)
        spec = Engine(target, proposer, k=k).generate(prompt, params)
        assert spec.token_ids == plain.token_ids, f"{case} K={k}: speculative greedy differs from plain"
        drafted += spec.stats.drafted
    assert drafted > 0, f"{case} K={k} never drafted: the equality proved nothing"


@pytest.mark.parametrize("k", K_VALUES)
@pytest.mark.parametrize("case", CASES)
def test_greedy_speculative_equals_plain_on_native_weights(case, k, native_target):
    """Bitwise: the kernel gives a row the same bits alone or inside a verification block, with no padding."""
    _assert_greedy_speculation_is_plain(native_target, case, k)


def test_weights_gguf_on_a_safetensors_folder_is_one_clear_error(tmp_path, monkeypatch):
    from tests.tiny import hf_model, save_hf

    folder = save_hf(hf_model("llama"), tmp_path / "hf")
    with pytest.raises(AuguryError, match="weights 'gguf' needs a .gguf file"):
        _load(folder, tmp_path / "home", monkeypatch, weights="gguf")
    with pytest.raises(AuguryError, match="unknown weights 'int3'"):
        _load(folder, tmp_path / "home", monkeypatch, weights="int3")


def test_default_weights_are_native_for_bf16_and_fp32_gguf(tmp_path, monkeypatch, capfd):
    """--dtype names the activations' type: bf16 and fp32 keep the file's blocks; fp16 dequantizes, in one line."""
    path = write_gguf(tmp_path / "tiny.gguf")
    default = _load(path, tmp_path / "home", monkeypatch)
    assert isinstance(default.decoder.weights.layers[0].wqkv, GgufWeight)
    fp32 = _load(path, tmp_path / "home", monkeypatch, dtype="fp32")
    assert isinstance(fp32.decoder.weights.layers[0].wqkv, GgufWeight) and fp32.decoder.dtype == torch.float32
    assert fp32.decoder.native is not None
    bf16 = _load(path, tmp_path / "home", monkeypatch, weights="bf16")
    assert not isinstance(bf16.decoder.weights.layers[0].wqkv, GgufWeight)
    capfd.readouterr()
    fp16 = _load(path, tmp_path / "home", monkeypatch, dtype="fp16")
    assert isinstance(fp16.decoder.weights.layers[0].wqkv, torch.Tensor)
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("augury:")]
    assert len(lines) == 1 and "fp16 has no native GGUF path" in lines[0], lines


def test_uncovered_block_type_falls_back_per_tensor_with_one_line(tmp_path, monkeypatch, capfd):
    path = write_gguf(tmp_path / "q2.gguf", odd={"blk.1.ffn_down.weight": "Q2_K"})
    capfd.readouterr()
    model = _load(path, tmp_path / "home", monkeypatch, weights="gguf")
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("augury:")]
    assert len(lines) == 1 and "blk.1.ffn_down.weight" in lines[0] and "Q2_K" in lines[0], lines
    layers = model.decoder.weights.layers
    assert isinstance(layers[0].w_down, GgufWeight) and not isinstance(layers[1].w_down, GgufWeight)
    _assert_greedy_speculation_is_plain(model, "ngram", 4)
    exact = _load(path, tmp_path / "home2", monkeypatch, dtype="fp32", weights="bf16")
    ref = _logits(exact)
    assert float((_logits(model) - ref).abs().max()) < 0.04 * float(ref.abs().max())


def test_without_the_kernel_the_torch_fallback_runs_and_says_so(tmp_path, monkeypatch, capfd):
    path = write_gguf(tmp_path / "tiny.gguf")
    with_kernel = _logits(_load(path, tmp_path / "home", monkeypatch, weights="gguf", use_cache=False))

    def fail():
        raise RuntimeError("simulated: no compiler")

    monkeypatch.setattr(ext_module, "_build", fail)
    ext_module.extension.cache_clear()
    try:
        capfd.readouterr()
        default = _load(path, tmp_path / "home", monkeypatch, use_cache=False)
        lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("augury:")]
        assert len(lines) == 1 and "simulated: no compiler" in lines[0], lines
        assert not isinstance(default.decoder.weights.layers[0].wqkv, GgufWeight), "unset weights fall back to bf16"
        model = _load(path, tmp_path / "home", monkeypatch, weights="gguf", use_cache=False)
        assert all(isinstance(m, GgufWeight) and m.kernel is None for m in _matmuls(model))
        fallback = _logits(model)
    finally:
        monkeypatch.undo()
        ext_module.extension.cache_clear()
    scale = float(with_kernel.abs().max())
    assert float((fallback - with_kernel).abs().max()) < 0.02 * scale, "the fallback computes the kernel's numbers"


def test_a_gguf_model_drafter_keeps_its_blocks_by_default(native_target):
    """--draft-quant auto: a GGUF drafter runs on its own blocks (kernel and C++ layer); gguf on a drafter
    without blocks is one clear error; the drafter's greedy speculation still equals plain decoding."""
    from augury.engine import Engine
    from augury.proposers import build_proposer
    from augury.sampling import SamplingParams

    path = native_target.source
    proposer = build_proposer("model", native_target, draft=str(path))
    drafter = proposer.decoder
    assert drafter.native is not None and isinstance(drafter.weights.layers[0].wqkv, GgufWeight)
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    plain = Engine(native_target).generate(PROMPT, params)
    spec = Engine(native_target, proposer, k=4).generate(PROMPT, params)
    assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0
    as_int4 = build_proposer("model", native_target, draft=str(path), draft_quant="int4")
    assert not isinstance(as_int4.decoder.weights.layers[0].wqkv, GgufWeight)
    with pytest.raises(AuguryError, match="--draft-quant gguf needs a GGUF drafter"):  # fp16: dequantized
        build_proposer("model", native_target, draft=str(path), draft_quant="gguf", dtype="fp16")


def test_a_gguf_drafter_requantized_to_q4_0_reads_fewer_bytes_and_stays_lossless(native_target):
    """--draft-quant q4_0: every matmul weight stored wider than Q4_0 (4.5 bits a value) is re-quantized
    to it and the narrower ones are kept; the drafter still runs on the C++ layer, reads fewer bytes,
    its logits stay close to its own blocks', and greedy speculation still equals plain decoding."""
    from augury.engine import Engine
    from augury.models.decoder import LINEAR_FIELDS
    from augury.proposers import build_proposer
    from augury.sampling import SamplingParams

    path = native_target.source
    own = build_proposer("model", native_target, draft=str(path), draft_quant="gguf")
    q4 = build_proposer("model", native_target, draft=str(path), draft_quant="q4_0")

    def matrices(decoder):
        w = decoder.weights
        return [getattr(layer, name) for layer in w.layers for name in LINEAR_FIELDS] + [w.lm_head]

    before, after = matrices(own.decoder), matrices(q4.decoder)
    assert any(b.bits_per_value() > 4.5 for b in before) and any(b.bits_per_value() <= 4.5 for b in before)
    for b, a in zip(before, after):
        if b.bits_per_value() > 4.5:
            assert a.kinds == ["Q4_0"], (b.kinds, a.kinds)
        else:  # kept as loaded (each proposer loads its own copy of the file)
            assert a.kinds == b.kinds and all(torch.equal(pa.data, pb.data) for pa, pb in zip(a.parts, b.parts))
    assert sum(a.nbytes for a in after) < sum(b.nbytes for b in before)
    assert q4.decoder.native is not None
    tokens = torch.tensor([PROMPT[:12]])
    logits = [d.forward(tokens, d.new_cache(1, 64)) for d in (own.decoder, q4.decoder)]
    off = float((logits[0] - logits[1]).abs().max()) / float(logits[0].abs().max())
    assert 0 < off < 0.2, f"re-quantized logits off by {off:.3f} of the largest"
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    plain = Engine(native_target).generate(PROMPT, params)
    spec = Engine(native_target, q4, k=4).generate(PROMPT, params)
    assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0
    with pytest.raises(AuguryError, match="--draft-quant q4_0 re-quantizes a GGUF drafter"):  # fp16: dequantized
        build_proposer("model", native_target, draft=str(path), draft_quant="q4_0", dtype="fp16")


def test_a_drafters_head_is_cut_to_its_vocabulary_before_it_is_requantized(native_target, monkeypatch):
    """--draft-vocab with --draft-quant q4_0: only the head rows the drafter keeps are re-quantized (the
    0.5B's head is 151,936 rows, of which 32,768 are kept), by the first ids or by a ranked list of ids,
    and the drafted logits are -inf outside the kept ids; greedy speculation still equals plain. The
    quantized self-draft's int4 copy converts only its kept head rows too."""
    from augury.engine import Engine
    from augury.kernels.weight import GgufWeight
    from augury.proposers import build_proposer
    from augury.sampling import SamplingParams

    converted = []
    requantized = GgufWeight.requantized

    def counted(self, kind):
        converted.append(self.shape[0])
        return requantized(self, kind)

    monkeypatch.setattr(GgufWeight, "requantized", counted)
    path = str(native_target.source)
    vocab = native_target.config.vocab_size
    keep = vocab // 2
    first = build_proposer("model", native_target, draft=path, draft_quant="q4_0", draft_vocab=keep)
    assert first.decoder.weights.lm_head.shape[0] == keep and first.decoder.weights.lm_head.kinds == ["Q4_0"]
    assert vocab not in converted and keep in converted, converted
    ids = torch.arange(1, vocab, 2)  # every other id, ascending
    converted.clear()
    from augury.models.low_bit import requantize_decoder

    own = build_proposer("model", native_target, draft=path, draft_vocab=0, draft_quant="gguf").decoder
    ranked = requantize_decoder(own.with_head_rows(ids), "Q4_0")
    assert converted.count(len(ids)) == 1 and vocab not in converted, converted
    assert torch.equal(ranked.head_ids, ids)
    logits = ranked.forward(torch.tensor([PROMPT[:8]]), ranked.new_cache(1, 32))  # [1, 8, vocab]
    outside = torch.ones(vocab, dtype=torch.bool)
    outside[ids] = False
    assert logits.shape[-1] == vocab and bool(torch.isinf(logits[..., outside]).all())
    assert bool(torch.isfinite(logits[..., ids]).all())
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    plain = Engine(native_target).generate(PROMPT, params)
    spec = Engine(native_target, first, k=4).generate(PROMPT, params)
    assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0
    # The quantized self-draft cuts the target's head before its int4 copy is made, the same way.
    from augury.models import low_bit

    made = []
    low_bit_weight = low_bit.low_bit_weight

    def recorded(weight, *args, **kwargs):
        made.append(weight.shape[0])
        return low_bit_weight(weight, *args, **kwargs)

    monkeypatch.setattr(low_bit, "low_bit_weight", recorded)
    copy = build_proposer("quantized", native_target, draft_vocab=keep)
    assert copy.decoder.weights.lm_head.shape[0] == keep and keep in made and vocab not in made, made
    spec = Engine(native_target, copy, k=4).generate(PROMPT, params)
    assert spec.token_ids == plain.token_ids


def test_a_drafter_trimmed_of_layers_keeps_its_blocks_and_stays_lossless(native_target):
    """--draft-skip-layers: the drafter runs without the layers named, on the same C++ layer and blocks
    (alone or re-quantized), drafts different logits, and greedy speculation still equals plain decoding;
    a list it cannot take is one error naming the flag."""
    from augury.engine import Engine
    from augury.proposers import build_proposer
    from augury.sampling import SamplingParams

    path = str(native_target.source)
    own = build_proposer("model", native_target, draft=path)
    layers = own.decoder.config.num_layers
    trimmed = build_proposer("model", native_target, draft=path, draft_skip_layers="0")
    both = build_proposer("hybrid", native_target, draft=path, draft_skip_layers="0", draft_quant="q4_0")
    assert trimmed.decoder.config.num_layers == layers - 1 and trimmed.decoder.native is not None
    kept = trimmed.decoder.weights.layers[0]
    assert kept.wqkv.kinds == own.decoder.weights.layers[1].wqkv.kinds  # layer 1 moved up, its own blocks
    assert all(torch.equal(a.data, b.data) for a, b in zip(kept.wqkv.parts, own.decoder.weights.layers[1].wqkv.parts))
    assert both.model.decoder.config.num_layers == layers - 1 and both.model.decoder.native is not None
    tokens = torch.tensor([PROMPT])
    logits = [d.forward(tokens, d.new_cache(1, 64)) for d in (own.decoder, trimmed.decoder)]
    assert not torch.equal(logits[0], logits[1]), "leaving a layer out changed nothing"
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    plain = Engine(native_target).generate(PROMPT, params)
    for proposer in (trimmed, both):
        spec = Engine(native_target, proposer, k=4, adaptive=False).generate(PROMPT, params)
        assert spec.token_ids == plain.token_ids and spec.stats.drafted > 0
    for spec, match in ((f"{layers}", "out of range"), ("0,x", "--draft-skip-layers '0,x' is neither"),
                        (",".join(map(str, range(layers))), "cannot skip all")):
        with pytest.raises(AuguryError, match=match):
            build_proposer("model", native_target, draft=path, draft_skip_layers=spec)
