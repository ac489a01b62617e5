"""The decoder against transformers, and the cache's rollback and ragged batches."""

from __future__ import annotations

import pytest
import torch

from augury.models.decoder import OneDnnWeight, dense_weight, onednn_packing_available, pack_weights
from tests.tiny import ARCHS, decoder_from_hf, hf_model, random_decoder, save_hf

needs_packing = pytest.mark.skipif(
    not onednn_packing_available(torch.bfloat16, torch.device("cpu")),
    reason="oneDNN packed bf16 linear not available on this CPU",
)


def rel_err(ours: torch.Tensor, ref: torch.Tensor) -> float:
    return float((ours - ref).abs().max() / ref.abs().max())


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tmp_path_factory):
    arch = request.param
    model = hf_model(arch)
    folder = save_hf(model, tmp_path_factory.mktemp(arch))
    return arch, model, decoder_from_hf(folder)


def test_logits_match_transformers(pair):
    arch, model, ours = pair
    torch.manual_seed(1)
    tokens = torch.randint(0, 96, (2, 13))
    with torch.no_grad():
        ref = model(tokens).logits.float()
    cache = ours.new_cache(2, 64)
    logits = ours.forward(tokens, cache)
    assert rel_err(logits, ref) < 1e-4, f"{arch}: relative error {rel_err(logits, ref):.2e}"


def test_incremental_decoding_matches_full_forward(pair):
    """Prefill 7 tokens then feed 1, 2 and 3 more: every row equals the one-shot forward."""
    arch, model, ours = pair
    torch.manual_seed(2)
    tokens = torch.randint(0, 96, (1, 13))
    with torch.no_grad():
        ref = model(tokens).logits.float()
    cache = ours.new_cache(1, 64)
    chunks = [ours.forward(tokens[:, :7], cache)]
    for lo, hi in ((7, 8), (8, 10), (10, 13)):
        chunks.append(ours.forward(tokens[:, lo:hi], cache))
    logits = torch.cat(chunks, dim=1)
    assert cache.lengths == [13]
    assert rel_err(logits, ref) < 1e-4, f"{arch}: relative error {rel_err(logits, ref):.2e}"


def test_rollback_then_reforward_equals_fresh_prefill(pair):
    """Write 5 speculative tokens, roll back 3, feed different ones: identical to never having written them."""
    arch, _, ours = pair
    torch.manual_seed(3)
    prefix = torch.randint(0, 96, (1, 9))
    junk = torch.randint(0, 96, (1, 5))
    tail = torch.randint(0, 96, (1, 4))
    cache = ours.new_cache(1, 64)
    ours.forward(prefix, cache)
    ours.forward(junk, cache)
    cache.truncate(9 + 2)
    rolled = ours.forward(tail, cache)

    fresh_cache = ours.new_cache(1, 64)
    ours.forward(torch.cat([prefix, junk[:, :2]], dim=1), fresh_cache)
    fresh = ours.forward(tail, fresh_cache)
    assert torch.equal(rolled, fresh), f"{arch}: rollback changed the logits"
    n = cache.lengths[0]
    for layer in range(ours.config.num_layers):
        assert torch.equal(cache.keys[layer][:, :, :n], fresh_cache.keys[layer][:, :, :n])


def test_ragged_batch_equals_one_by_one(pair):
    """Two sequences with different prefix lengths decoded together equal each decoded alone."""
    arch, _, ours = pair
    torch.manual_seed(4)
    seqs = [torch.randint(0, 96, (1, 11)), torch.randint(0, 96, (1, 6))]
    steps = torch.randint(0, 96, (2, 3))

    alone = []
    for b, seq in enumerate(seqs):
        cache = ours.new_cache(1, 64)
        ours.forward(seq, cache)
        alone.append(ours.forward(steps[b : b + 1], cache))

    batch_cache = ours.new_cache(2, 64)
    # Prefill each row separately into the shared cache (different lengths), then step together.
    for b, seq in enumerate(seqs):
        single = ours.new_cache(1, 64)
        ours.forward(seq, single)
        for layer in range(ours.config.num_layers):
            batch_cache.keys[layer][b] = single.keys[layer][0]
            batch_cache.values[layer][b] = single.values[layer][0]
    batch_cache.lengths = [11, 6]
    together = ours.forward(steps, batch_cache)
    for b in range(2):
        err = rel_err(together[b : b + 1], alone[b])
        assert err < 1e-5, f"{arch}: row {b} differs by {err:.2e}"
    assert batch_cache.lengths == [14, 9]


@pytest.mark.parametrize("block", [1, 3])
def test_short_blocks_in_one_masked_call_equal_rows_attended_alone(pair, block):
    """A GPU attends decode and verification blocks of a ragged batch in one masked call
    (`masked_short_blocks`); its logits are the row-by-row path's, the CPU's reference."""
    arch, _, ours = pair
    assert not ours.masked_short_blocks, "on a CPU short blocks attend row by row (their bits are each row's own)"
    torch.manual_seed(5)
    prompts = torch.randint(0, 96, (3, 12))
    steps = torch.randint(0, 96, (3, block))
    logits = {}
    for masked in (False, True):
        cache = ours.new_cache(3, 64)
        ours.forward(prompts, cache)
        cache.lengths = [12, 7, 4]  # ragged: rows 1 and 2 forget their last positions
        ours.masked_short_blocks = masked
        try:
            logits[masked] = ours.forward(steps, cache)
        finally:
            ours.masked_short_blocks = False
        assert cache.lengths == [12 + block, 7 + block, 4 + block]
    err = rel_err(logits[True], logits[False])
    assert err < 1e-5, f"{arch}: masked short blocks differ from rows attended alone by {err:.2e}"


def test_single_token_padding_is_invisible(pair):
    """Padding one-token steps must not change results (compared to no padding), whatever padding applies."""
    from augury.calibration import NO_PADDING, RowPadding

    arch, _, ours = pair
    torch.manual_seed(5)
    tokens = torch.randint(0, 96, (1, 8))
    outs = []
    measured = ours.padding
    for padding in (NO_PADDING, RowPadding(tuple(max(16, -(-r // 4) * 4) for r in range(1, 49)), 4, 48)):
        ours.padding = padding
        cache = ours.new_cache(1, 64)
        ours.forward(tokens[:, :7], cache)
        outs.append(ours.forward(tokens[:, 7:], cache))
        assert cache.lengths == [8]
    ours.padding = measured
    assert rel_err(outs[1], outs[0]) < 1e-5


@pytest.mark.parametrize(
    "dtype, pack",
    [(torch.float32, False), (torch.bfloat16, False), (torch.bfloat16, True)],
    ids=["fp32", "bf16", "bf16-packed"],
)
@pytest.mark.parametrize("block", [2, 3, 5, 9])
def test_block_logits_are_bitwise_single_step_logits(dtype, pack, block):
    """What makes speculative greedy output identical to plain: verifying a block gives the same bits."""
    from tests.tiny import random_decoder

    if pack and not onednn_packing_available(dtype, torch.device("cpu")):
        pytest.skip("oneDNN packed bf16 linear not available on this CPU")
    model = random_decoder(vocab=50, seed=7, dtype=dtype, layers=2, hidden=128, pack=pack)
    assert isinstance(model.weights.layers[0].wqkv, OneDnnWeight) == pack
    torch.manual_seed(6)
    prefix = torch.randint(0, 50, (1, 21))
    block_tokens = torch.randint(0, 50, (1, block))

    cache = model.new_cache(1, 64)
    model.forward(prefix, cache)
    together = model.forward(block_tokens, cache)

    cache = model.new_cache(1, 64)
    model.forward(prefix, cache)
    one_by_one = torch.cat([model.forward(block_tokens[:, i : i + 1], cache) for i in range(block)], dim=1)
    assert torch.equal(together, one_by_one)


@needs_packing
@pytest.mark.parametrize("shape", [(7, 5), (96, 32), (640, 128)])
def test_packed_weight_rows_are_batch_invariant_and_round_trip(shape):
    """A packed weight gives every row the same bits at any row count >= 2 (what lets server
    batches of any size agree with single requests), equals F.linear's two-row result, and
    gives back its dense weight bitwise."""
    gen = torch.Generator().manual_seed(3)
    weight = torch.randn(*shape, generator=gen).bfloat16()
    packed = OneDnnWeight(weight)
    x = torch.randn(130, shape[1], generator=gen).bfloat16()
    bias = torch.randn(shape[0], generator=gen).bfloat16()
    pair = torch.nn.functional.linear(x[:2], weight, bias)
    for rows in (2, 3, 4, 8, 17, 33, 64, 130):
        assert torch.equal(packed.linear(x[:rows], bias)[:2], pair), rows
    assert torch.equal(packed.dense(), weight)
    assert torch.equal(packed[2:5].dense(), weight[2:5])
    assert packed.nbytes == weight.numel() * 2


@needs_packing
@pytest.mark.parametrize("arch", ARCHS)
def test_packed_decoder_equals_plain_decoder(arch, tmp_path):
    """Packing changes the layout, not the model: logits of blocks of >= 2 rows are bitwise those
    of the same bf16 weights through F.linear, for each architecture."""
    model = hf_model(arch)
    plain = decoder_from_hf(save_hf(model, tmp_path), dtype=torch.bfloat16)
    packed = type(plain)(plain.config, pack_weights(plain.weights))
    tied = plain.weights.lm_head is plain.weights.embed
    assert (packed.weights.lm_head.shared_dense is plain.weights.embed) == tied
    assert torch.equal(dense_weight(packed.weights.layers[1].w_down), plain.weights.layers[1].w_down)
    torch.manual_seed(4)
    tokens = torch.randint(0, 96, (2, 11))
    outs = []
    for decoder in (plain, packed):
        cache = decoder.new_cache(2, 64)
        first = decoder.forward(tokens[:, :8], cache)
        outs.append(torch.cat([first, decoder.forward(tokens[:, 8:], cache)], dim=1))
    assert torch.equal(outs[0], outs[1])


def test_measuring_padding_does_not_keep_a_model_alive():
    """A dropped decoder's weights are freed although its padding stays memoized (a leak kept real models' GBs)."""
    import gc
    import weakref

    decoder = random_decoder(vocab=24, seed=5, hidden=48, layers=1)
    weights = weakref.ref(decoder.weights)
    assert decoder.padding is not None  # measured (or memoized) for this shape
    del decoder
    gc.collect()
    assert weights() is None


class _RowCountQuirk:
    """A matmul that rounds differently unless it has 2 or 3 rows, as a CPU library that picks its
    kernel by the row count does."""

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight, self.shape = weight, weight.shape

    def linear(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        # one row at a time: invariant by construction, but for the quirk
        out = torch.cat([torch.nn.functional.linear(row, self.weight, bias) for row in x.split(1)])
        return out if x.shape[0] in (2, 3) else out * (1 + 2**-10)

    def dense(self) -> torch.Tensor:
        return self.weight


def test_a_batch_past_the_calibrated_rows_runs_in_pieces_and_keeps_every_rows_bits():
    """Two sequences verifying 4 tokens each are one 8-row matmul; where only 2-3 rows agree with a
    row alone, the decoder must run them as pieces of 3, 3 and 2 rows. Padding alone to a row
    multiple (one 8-row matmul) gives other bits, which shows the check can fail."""
    from dataclasses import replace

    from augury.calibration import RowPadding
    from augury.models.decoder import LINEAR_FIELDS
    from tests.tiny import random_decoder

    model = random_decoder(vocab=50, seed=3, dtype=torch.float32, layers=2, hidden=64)
    w = model.weights
    w.layers = [replace(l, **{n: _RowCountQuirk(getattr(l, n)) for n in LINEAR_FIELDS}) for l in w.layers]
    w.lm_head = _RowCountQuirk(w.lm_head)
    torch.manual_seed(2)
    prefix = torch.randint(0, 50, (2, 9))
    block = torch.randint(0, 50, (2, 4))

    def batched(padding: RowPadding) -> torch.Tensor:
        model.padding = padding
        cache = model.new_cache(2, 32)
        model.forward(prefix, cache)
        return model.forward(block, cache)

    model.padding = RowPadding((2, 2, 3), 0, 3)
    alone = []
    for b in range(2):
        cache = model.new_cache(1, 32)
        model.forward(prefix[b : b + 1], cache)
        alone.append(torch.cat([model.forward(block[b : b + 1, i : i + 1], cache) for i in range(4)], dim=1))
    assert model.padding.pieces(8) == [(3, 3), (3, 3), (2, 2)]
    assert torch.equal(batched(RowPadding((2, 2, 3), 0, 3)), torch.cat(alone))
    assert not torch.equal(batched(RowPadding((2, 2, 3), 1, 3)), torch.cat(alone))
