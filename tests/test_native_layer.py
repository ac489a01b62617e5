"""The C++ decoder layer (kernels/csrc/layer_body.h) against the torch layer, its batch invariance, its ISAs.

Tiny random models with GGUF block weights in the shapes of the three
architectures (qwen2: q/k/v biases and GQA; llama: GQA, no biases; gemma3: q/k
norms, norms after attention and MLP, GELU, sliding-window layers with their
own RoPE base, a scaled embedding, a tied head), built in memory.
"""

from __future__ import annotations

import platform

import pytest
import torch

from augury.errors import AuguryError
from augury.kernels import extension as ext_module
from augury.kernels.weight import GgufWeight
from augury.models.decoder import Decoder
from tests.native_tiny import ARCHS, VOCAB, quant_blocks, native_config, native_weights

# What the native layer may differ from the torch layer by, as a fraction of the largest logit.
# Most rows differ by fp32 rounding (sums in another order, the softmax's polynomial exp): under
# TYPICAL. But where the two paths' fp32 inputs to a matmul straddle a rounding boundary of the
# kernel's int8 activations, one input moves a whole quant step, and through the K/V cache that
# carries on to the later rows of the block: such rows measured up to 5.6e-3 here, under BOUND.
TYPICAL, BOUND = 1e-5, 2e-2


@pytest.fixture(scope="module", autouse=True)
def _kernel():
    if ext_module.extension() is None:
        pytest.skip("the GGUF kernel extension cannot be built here")


def _pair(arch: str, dtype: torch.dtype = torch.float32) -> tuple[Decoder, Decoder]:
    weights = native_weights(arch, dtype)
    config = native_config(arch)
    native = Decoder(config, weights)
    torch_layer = Decoder(config, weights, native=False)
    assert native.native is not None and torch_layer.native is None
    return native, torch_layer


def _tokens(n: int, seed: int) -> torch.Tensor:
    return torch.randint(2, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ARCHS)
def test_native_layer_matches_the_torch_layer(arch):
    """1-33 new rows after odd cache lengths (both paths prefill alike, then each runs its block)."""
    native, ref = _pair(arch)
    row_errors, first_rows = [], []
    for prefix, rows in [(1, 1), (37, 1), (37, 5), (13, 17), (101, 33), (0, 3)]:
        outs = []
        for dec in (native, ref):
            cache = dec.new_cache(1, 256)
            if prefix:  # 101 is past the row-attention limit: the torch layer prefills it on both
                dec.forward(_tokens(prefix, 1), cache)
            outs.append(dec.forward(_tokens(rows, 2), cache))
        got, want = outs
        err = (got - want).abs().amax(-1).flatten() / float(want.abs().max())
        assert float(err.max()) < BOUND, f"{arch} prefix {prefix} rows {rows}: off by {float(err.max()):.2e}"
        row_errors.append(err)
        first_rows.append(float(err[0]))
    # A flip carries on to the block's later rows, so how many rows it reaches depends on where the
    # first one falls (on the Intel AMX machine of 2026-12-02, gemma3's 17- and 33-row blocks flipped
    # at their 8th row: 47% of rows within TYPICAL). A systematic difference (a wrong norm, RoPE or
    # activation) moves every row, the first of each block included.
    errors = torch.cat(row_errors)
    typical = float((errors < TYPICAL).float().mean())
    firsts = sum(e < TYPICAL for e in first_rows)
    assert typical >= 0.35, f"{arch}: only {typical:.0%} of rows within fp32 rounding: a systematic difference"
    assert firsts >= len(first_rows) - 1, f"{arch}: only {firsts} blocks start within fp32 rounding"
    assert float(errors.max()) > 0, "the two paths agreed bitwise: is the native layer running at all?"


@pytest.mark.parametrize("arch", ARCHS)
def test_native_layer_matches_after_a_torch_prefill(arch):
    """A prompt past the row-attention limit goes through the torch layer; the native steps read its cache."""
    native, ref = _pair(arch)
    outs = []
    for dec in (native, ref):
        cache = dec.new_cache(1, 256)
        dec.forward(_tokens(dec.row_attention_limit + 7, 3), cache)
        outs.append(torch.cat([dec.forward(_tokens(1, 10 + i), cache) for i in range(4)], dim=1))
    err = float((outs[0] - outs[1]).abs().max()) / float(outs[1].abs().max())
    assert err < BOUND, f"{arch}: off by {err:.2e} after a torch prefill"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("arch", ARCHS)
def test_native_block_rows_are_bitwise_single_step_rows(arch, dtype):
    """A chain of T rows gives each row the bits it gets alone (T = 1..33), batched sequences too."""
    native, _ = _pair(arch, dtype)
    prompt = _tokens(23, 4)
    chain = _tokens(33, 5)
    cache = native.new_cache(1, 256)
    native.forward(prompt, cache)
    alone = torch.cat([native.forward(chain[:, i : i + 1], cache) for i in range(33)], dim=1)
    for rows in (2, 5, 8, 16, 33):
        cache.truncate(23)
        block = native.forward(chain[:, :rows], cache)
        assert torch.equal(block, alone[:, :rows]), f"{arch} {dtype}: a {rows}-row block differs from single steps"
    # two sequences of different lengths in one forward: each row as it is alone
    pool = native.new_cache(2, 256)
    native.forward(prompt, pool.rows(0, 1))
    native.forward(prompt[:, :11], pool.rows(1, 2))
    both = native.forward(torch.cat([chain[:, :4], chain[:, 4:8]]), pool)
    solo = native.new_cache(1, 256)
    native.forward(prompt[:, :11], solo)
    assert torch.equal(both[0], alone[0, :4]) and torch.equal(both[1], native.forward(chain[:, 4:8], solo)[0])


def test_native_tree_block_matches_its_chains():
    """A token tree (block mask) gives each node the bits of the chain from the root to it."""
    native, _ = _pair("qwen2")
    prompt = _tokens(19, 6)
    # root 0, children 1 and 2 of 0, child 3 of 1
    tree = torch.tensor([[40, 41, 42, 43]])
    parents = [-1, 0, 0, 1]
    mask = torch.zeros(4, 4, dtype=torch.bool)
    for i, p in enumerate(parents):
        mask[i, i] = True
        while p >= 0:
            mask[i, p] = True
            p = parents[p]
    positions = torch.tensor([[19, 20, 20, 21]])
    cache = native.new_cache(1, 256)
    native.forward(prompt, cache)
    got = native.forward(tree, cache, positions=positions, block_mask=mask)
    for node, path in [(3, [0, 1, 3]), (2, [0, 2])]:
        cache.truncate(19)
        chain = native.forward(tree[:, path], cache)
        assert torch.equal(got[0, node], chain[0, -1]), f"tree node {node} differs from its chain"


def test_every_instruction_set_gives_the_native_layer_the_same_bits(monkeypatch):
    """AVX-512, AVX2 and portable C++ run the same arithmetic in the same order; the ones this CPU lacks are skipped."""
    runs = ext_module.extension().available_isas()
    logits = {}
    for isa in runs:
        monkeypatch.setenv("AUGURY_ISA", isa)
        ext_module.kernel_isa.cache_clear()
        decoder = Decoder(native_config("gemma3"), native_weights("gemma3", torch.bfloat16))
        assert decoder.native.isa == isa
        cache = decoder.new_cache(1, 256)
        decoder.forward(_tokens(17, 7), cache)
        logits[isa] = decoder.forward(_tokens(6, 8), cache)
    ext_module.kernel_isa.cache_clear()
    first = runs[0]
    for isa in runs[1:]:
        assert torch.equal(logits[isa], logits[first]), f"{isa} differs from {first}"
    on_arm = platform.machine().lower() in ("aarch64", "arm64")
    other_architecture = {"avx512", "avxvnni", "avx2"} if on_arm else {"neon"}
    missing = sorted(set(ext_module.ISAS) - other_architecture - set(runs))
    if missing:
        pytest.skip(f"compared {', '.join(runs)}; this CPU cannot run {', '.join(missing)}")


def test_weights_without_the_kernel_keep_the_torch_layer():
    weights = native_weights("llama", torch.float32)
    for layer in weights.layers:
        layer.wo = layer.wo.dense()  # one plain matmul weight: the layer is not all blocks
    assert Decoder(native_config("llama"), weights).native is None


def test_a_head_size_the_native_layer_does_not_take_keeps_the_torch_layer():
    """Head sizes outside 16..256 in steps of 16 run on the torch layer instead of failing in C++."""
    from augury.models.native_layers import NativeStack

    config = native_config("llama")
    weights = native_weights("llama", torch.float32)
    assert NativeStack.build(config, weights, 0.125) is not None
    from dataclasses import replace

    assert NativeStack.build(replace(config, head_dim=72), weights, 0.125) is None


def test_augury_isa_forces_a_path_and_refuses_bad_values(monkeypatch, capfd):
    try:
        monkeypatch.setenv("AUGURY_ISA", "portable")
        ext_module.kernel_isa.cache_clear()
        assert GgufWeight([quant_blocks("Q4_0", 16, 64, 0.1, torch.Generator())]).isa == "portable"
        monkeypatch.setenv("AUGURY_ISA", "sse9")
        ext_module.kernel_isa.cache_clear()
        with pytest.raises(AuguryError, match="AUGURY_ISA='sse9' is not a kernel path"):
            ext_module.kernel_isa()

        class OnlyPortable:
            @staticmethod
            def available_isas():
                return ["portable"]

        monkeypatch.setattr(ext_module, "extension", lambda: OnlyPortable)
        monkeypatch.setenv("AUGURY_ISA", "avx512")
        ext_module.kernel_isa.cache_clear()
        with pytest.raises(AuguryError, match="AUGURY_ISA=avx512 cannot run on this CPU"):
            ext_module.kernel_isa()
        monkeypatch.undo()

        monkeypatch.setenv("AUGURY_ISA", "torch")
        ext_module.extension.cache_clear()
        ext_module.kernel_isa.cache_clear()
        capfd.readouterr()
        assert ext_module.extension() is None and ext_module.kernel_isa() == "torch"
        assert "AUGURY_ISA=torch" in capfd.readouterr().err
    finally:
        monkeypatch.undo()
        ext_module.extension.cache_clear()
        ext_module.kernel_isa.cache_clear()
