"""Q4_0 re-quantization for a drafter (`augury.kernels.requantize`): the round-to-nearest quantizer is the gguf
package's bit for bit, the fitted one never does worse than it in squared error, and the C++ kernel's fit is
the torch reference's, byte for byte."""

import pytest
import torch

from augury.kernels import extension as ext_module
from augury.kernels import reference, requantize


def _weights(generator: torch.Generator) -> torch.Tensor:
    """[24, 256] fp32 weights with the blocks a quantizer trips on: all zeros, one spike, a negative largest
    value, ties for the largest magnitude, values on a 5-bit grid (a Q5_0 drafter's), and tiny ones."""
    w = torch.randn(24, 256, generator=generator) * 0.02
    w[0, :32] = 0.0
    w[1, :32] = 0.0
    w[1, 5] = 0.3
    w[2, :32] = -w[2, :32].abs()
    w[3, :32] = torch.tensor([0.1, -0.1] * 16)
    grid = torch.randint(-16, 16, (4, 256), generator=generator).float() * 0.0037
    w[4:8] = grid
    w[8] *= 1e-6
    return w


def _squared_error(blocks: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Per 32-value block, the squared error of Q4_0 `blocks` against `w`: [out * in / 32]."""
    return ((reference.dequantize("Q4_0", blocks) - w) ** 2).reshape(-1, 32).sum(1)


def test_round_to_nearest_is_the_gguf_packages_quantizer_bit_for_bit():
    import gguf

    w = _weights(torch.Generator().manual_seed(1))
    ours = requantize.round_to_nearest(w)
    theirs = torch.from_numpy(gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q4_0).copy())
    assert ours.shape == (24, 256 // 32 * 18)
    assert torch.equal(ours, theirs)


def test_a_fitted_scale_never_does_worse_than_round_to_nearest():
    w = _weights(torch.Generator().manual_seed(2))
    nearest, fit = requantize.round_to_nearest(w), requantize.fitted(w)
    e_nearest, e_fit = _squared_error(nearest, w), _squared_error(fit, w)
    # fp16 stores each block's fitted scale; the reference's -8 divisor is on the grid, so the fit can lose
    # only that rounding (a relative 2^-11 of the scale, about 2^-10 of the error).
    assert bool((e_fit <= e_nearest * (1 + 2e-3) + 1e-12).all()), float((e_fit / e_nearest.clamp(min=1e-30)).max())
    assert float(e_fit.sum()) < 0.9 * float(e_nearest.sum()), (float(e_fit.sum()), float(e_nearest.sum()))
    assert float(e_fit[0]) == 0.0, "an all-zero block must come back exact"
    with pytest.raises(ValueError, match="whole 32-value blocks"):
        requantize.fitted(torch.zeros(2, 40))


def test_the_kernels_fit_is_the_references_byte_for_byte():
    kernel = ext_module.extension()
    if kernel is None:
        pytest.skip("the C++ extension cannot be built here")
    w = _weights(torch.Generator().manual_seed(3))
    big = torch.randn(300, 4096, generator=torch.Generator().manual_seed(4)) * 0.05  # many blocks, several threads
    for matrix in (w, big):
        assert torch.equal(requantize.fitted(matrix, kernel=kernel), requantize.fitted(matrix))
    with pytest.raises(RuntimeError, match="float32 tensor"):
        kernel.fit_q4_0(torch.zeros(4, 16), list(requantize.FIT_DIVISORS))
