"""The GGUF kernel against its plain-torch reference, and the reference against the gguf package."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from augury.kernels import extension as ext_module
from augury.kernels import packing, reference
from augury.kernels.weight import GgufWeight, fallback_matmul

KINDS = reference.KINDS
OUT, IN = 37, 512  # 37: a partial last tile of 16 columns; 512: two 256-value K blocks
ROWS = 33  # one more than the decode/verification range, so a second row chunk is never needed but tails are


@pytest.fixture(scope="module")
def ext():
    module = ext_module.extension()
    if module is None:
        pytest.skip("the GGUF kernel extension cannot be built here")
    return module


def test_the_extension_builds_wherever_a_compiler_is_present():
    """Every kernel test skips where the extension cannot be built, so a compile error in csrc/ would
    otherwise pass the suite on the torch fallback: where a C++ compiler is present, build it here
    and let its error, if any, fail this test."""
    if shutil.which("c++") is None:
        pytest.skip("no C++ compiler here: the torch fallback is the expected path")
    if ext_module.forced_isa() == "torch":
        pytest.skip(f"{ext_module.ISA_ENV}=torch asks for the fallback")
    module = ext_module._build()
    assert "portable" in module.available_isas()  # every CPU runs the plain C++ body


def test_one_build_serves_every_cpu_of_an_architecture(monkeypatch):
    """The library picks its instruction set when it runs, so its cache key leaves the CPU's flag list
    out (a VM whose list changed rebuilt for a minute) and keeps the architecture in."""
    key = ext_module.build_key()
    monkeypatch.setattr(ext_module, "_cpu_flags", lambda: "fpu sse2 avx512f a-list-from-another-host")
    assert ext_module.build_key() == key
    monkeypatch.setattr(ext_module.platform, "machine", lambda: "riscv64")
    assert ext_module.build_key() != key


def _isas() -> list[str]:
    module = ext_module.extension()
    return module.available_isas() if module is not None else []


def _blocks(kind: str, out: int = OUT, n_in: int = IN, seed: int = 0) -> torch.Tensor:
    return reference.random_blocks(kind, out, n_in, torch.Generator().manual_seed(seed))


def _x(rows: int = ROWS, n_in: int = IN, seed: int = 1) -> torch.Tensor:
    # Heavy-tailed rows with an outlier per row, like real hidden states.
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, n_in, generator=gen) * torch.rand(rows, 1, generator=gen).add(0.1)
    x[torch.arange(rows), torch.randint(0, n_in, (rows,), generator=gen)] *= 20
    return x


def _kernel(ext, x, parts, isa, bias=None):
    return ext.linear(x, [packing.pack(reference.decode(k, raw)) for k, raw in parts],
                      [packing.KIND_ID[k] for k, _ in parts], [raw.shape[0] for _, raw in parts], bias, isa)


# --- the reference ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_reference_dequantizes_bitwise_like_the_gguf_package(kind):
    import gguf

    qtype = gguf.GGMLQuantizationType[kind]
    cases = [_blocks(kind)]
    w = np.random.default_rng(0).standard_normal((OUT, IN)).astype(np.float32)
    cases.append(reference.quantize(kind, torch.from_numpy(w)))  # the gguf package's quantizer where it has one
    for raw in cases:
        ours = reference.dequantize(kind, raw)
        theirs = torch.from_numpy(gguf.quants.dequantize(raw.numpy(), qtype))
        assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32)), f"{kind}: not bitwise gguf's values"


@pytest.mark.parametrize("kind", KINDS)
def test_quantizer_round_trips_within_its_step(kind):
    w = torch.randn(OUT, IN, generator=torch.Generator().manual_seed(3)) * 0.1
    err = float((reference.dequantize(kind, reference.quantize(kind, w)) - w).norm() / w.norm())
    bits = {"Q4_0": 4, "Q4_1": 4, "Q4_K": 4, "Q5_0": 5, "Q5_1": 5, "Q5_K": 5, "Q6_K": 6, "Q8_0": 8}[kind]
    assert err < 2.0 ** (1 - bits), f"{kind}: relative error {err:.3f} is more than a {bits}-bit grid gives"


def test_bad_blocks_are_refused_in_one_line():
    with pytest.raises(ValueError, match="unsupported block type Q2_K"):
        reference.decode("Q2_K", torch.zeros(1, 84, dtype=torch.uint8))
    with pytest.raises(ValueError, match="not whole 144-byte blocks"):
        reference.decode("Q4_K", torch.zeros(1, 100, dtype=torch.uint8))
    with pytest.raises(ValueError, match="disagree on the input size"):
        GgufWeight([("Q8_0", torch.zeros(2, 34, dtype=torch.uint8)), ("Q8_0", torch.zeros(2, 68, dtype=torch.uint8))])


@pytest.mark.parametrize("kind", KINDS)
def test_pack_then_unpack_is_exact(kind):
    dec = reference.decode(kind, _blocks(kind))
    back = packing.unpack(packing.pack(dec), kind, OUT, IN)
    assert torch.equal(back.q, dec.q)
    for name, field in dec.fields.items():
        assert torch.equal(back.fields[name].reshape(field.shape).view(torch.uint8), field.view(torch.uint8)), name


def test_packed_layout_is_the_extensions(ext):
    for kind, lay in packing.LAYOUTS.items():
        assert list(ext.layout(packing.KIND_ID[kind])) == [lay.group_k, lay.subs, lay.sub_bytes, lay.group_bytes]


# --- the kernel ---------------------------------------------------------------------------------


def _accumulation_slack(size: torch.Tensor, n_in: int) -> torch.Tensor:
    """What fp32 sums of n_in / 16 sub-block terms in another order may differ by: (J + 8) ulps of sum |terms|."""
    return (n_in // 16 + 8) * 2.0**-24 * size


@pytest.mark.parametrize("isa", _isas())
@pytest.mark.parametrize("kind", KINDS)
def test_kernel_matches_reference_for_every_row_count(ext, kind, isa):
    raw = _blocks(kind)
    x = _x()
    want, size = reference.kernel_matmul(x, kind, raw)
    for rows in range(1, ROWS + 1):
        got = _kernel(ext, x[:rows], [(kind, raw)], isa)
        err = (got.double() - want[:rows]).abs()
        assert (err <= _accumulation_slack(size[:rows], IN)).all(), (
            f"{kind} {isa} rows={rows}: off the reference by {float((err / size[:rows]).max()):.2e} of sum |terms|"
        )


@pytest.mark.parametrize("isa", _isas())
@pytest.mark.parametrize("kind", KINDS)
def test_kernel_rows_are_bitwise_batch_invariant(ext, kind, isa):
    """Row i of a T-row call is bitwise the 1-row call on that row, for T = 1..33: what lossless greedy needs."""
    raw = _blocks(kind, seed=2)
    x = _x(seed=5).bfloat16()
    parts = [(kind, raw)]
    alone = torch.cat([_kernel(ext, x[i : i + 1], parts, isa) for i in range(ROWS)])
    for rows in range(1, ROWS + 1):
        block = _kernel(ext, x[:rows], parts, isa)
        assert torch.equal(block.view(torch.int16), alone[:rows].view(torch.int16)), f"{kind} {isa}: T={rows}"


@pytest.mark.parametrize("kind", KINDS)
def test_every_instruction_set_gives_the_same_bits(ext, kind):
    """AVX-512, AVX2 and the portable C++ body run the same operations in the same order."""
    raw = _blocks(kind, seed=9)
    x = _x(seed=10)
    runs = ext.available_isas()
    assert "portable" in runs, "the portable body runs on any CPU"
    first = _kernel(ext, x, [(kind, raw)], runs[0])
    for isa in runs[1:]:
        assert torch.equal(_kernel(ext, x, [(kind, raw)], isa), first), f"{kind}: {isa} differs from {runs[0]}"


@pytest.mark.parametrize("kind", KINDS)
def test_kernel_is_within_the_stated_bound_of_the_fp32_matmul(ext, kind):
    """|kernel - x @ W^T| <= sum_k |w_k| dx / 2 (int8 activations) + accumulation slack; and it is not exact."""
    raw = _blocks(kind, seed=4)
    x = _x(seed=6)
    got = _kernel(ext, x, [(kind, raw)], "auto").double()
    exact = reference.reference_matmul(x.double(), kind, raw).double()
    _, size = reference.kernel_matmul(x, kind, raw)
    bound = reference.error_bound(x, kind, raw) + _accumulation_slack(size, IN)
    err = (got - exact).abs()
    assert (err <= bound).all(), f"{kind}: error {float((err / bound).max()):.2f}x the bound"
    assert float(err.max()) > 0, "int8 activations cannot be exact on random data: is the bound test blind?"


@pytest.mark.parametrize("n_in", [256, 768])
def test_parts_bias_tails_and_bf16_output(ext, n_in):
    """Stacked parts of mixed types equal separate calls; bias is added in fp32; bf16 output is the rounded fp32."""
    parts = [("Q4_K", _blocks("Q4_K", 40, n_in, 1)), ("Q6_K", _blocks("Q6_K", 3, n_in, 2)),
             ("Q8_0", _blocks("Q8_0", 21, n_in, 3))]
    x = _x(7, n_in)
    bias = torch.randn(64, generator=torch.Generator().manual_seed(0))
    joint = _kernel(ext, x, parts, "auto", bias)
    alone = torch.cat([_kernel(ext, x, [p], "auto") for p in parts], dim=1) + bias
    assert torch.equal(joint, alone)
    as_bf16 = _kernel(ext, x.bfloat16(), parts, "auto", bias.bfloat16())
    fp32_of_bf16 = _kernel(ext, x.bfloat16().float(), parts, "auto", bias.bfloat16().float())
    assert as_bf16.dtype == torch.bfloat16 and torch.equal(as_bf16, fp32_of_bf16.bfloat16())


def test_two_threads_give_the_same_bits(ext):
    parts = [("Q4_K", _blocks("Q4_K", 200, 512, 8)), ("Q6_K", _blocks("Q6_K", 56, 512, 9))]
    x = _x(5)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _kernel(ext, x, parts, "auto")
        torch.set_num_threads(2)
        two = _kernel(ext, x, parts, "auto")
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


@pytest.mark.parametrize("threads", [3, 5])
def test_threads_that_steal_tiles_give_every_tile_once_with_its_bits(ext, threads):
    """Threads share a matmul's tiles in runs of at least 64 KB, each taking its own share's runs front
    to back and then the others' from the back (TileQueue). Here 29 runs and more threads than this
    machine's cores, so that preempted threads' runs are taken by the others: every column still
    equals one thread's pass (a run handed to no thread leaves its columns unwritten, one handed out
    badly writes another run's columns; a mutation that skipped a stolen run failed here)."""
    parts = [("Q4_0", _blocks("Q4_0", 2048, 1024, 3)), ("Q6_K", _blocks("Q6_K", 1040, 1024, 4))]
    x = _x(3, 1024)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _kernel(ext, x, parts, "auto")
        torch.set_num_threads(threads)
        many = [_kernel(ext, x, parts, "auto") for _ in range(4)]
    finally:
        torch.set_num_threads(before)
    for got in many:
        assert torch.equal(got, one)


# --- GgufWeight and its fallback -----------------------------------------------------------------


def test_weight_linear_dense_and_head_slices(ext):
    parts = [("Q4_K", _blocks("Q4_K", 40, IN, 1)), ("Q6_K", _blocks("Q6_K", 29, IN, 2))]
    w = GgufWeight(parts, dtype=torch.float32)
    assert w.shape == (69, IN) and w.kinds == ["Q4_K", "Q6_K"]
    dense = torch.cat([reference.dequantize(k, raw) for k, raw in parts])
    assert torch.equal(w.dense(), dense)
    x = _x(ROWS, seed=4).reshape(3, 11, IN)  # any leading shape
    y = w.linear(x, None)
    assert y.shape == (3, 11, 69)
    for rows in (slice(None, 30), slice(0, 45), slice(None, 69)):  # prefixes share storage
        part = w[rows]
        assert torch.equal(part.linear(x, None), y[..., rows])
    middle = w[10:50]  # anything else is repacked
    assert torch.equal(middle.dense(), dense[10:50])
    assert torch.equal(middle.linear(x, None), y[..., 10:50])
    as_bf16 = GgufWeight(parts)  # dense() through the C++ dequantizer: the same bits
    assert torch.equal(as_bf16.dense().view(torch.int16), dense.bfloat16().view(torch.int16))


@pytest.fixture
def no_extension(monkeypatch, capfd):
    """The extension as a machine without a compiler sees it; the cached real one is restored afterwards."""

    def fail():
        raise RuntimeError("simulated: no compiler")

    monkeypatch.setattr(ext_module, "_build", fail)
    ext_module.extension.cache_clear()
    capfd.readouterr()
    yield
    monkeypatch.undo()
    ext_module.extension.cache_clear()


def test_fallback_is_announced_once_and_computes_the_kernels_numbers(ext, no_extension, capfd):
    parts = [("Q4_K", _blocks("Q4_K", 40, IN, 1)), ("Q5_0", _blocks("Q5_0", 9, IN, 2))]
    x = _x(9)
    with_kernel = GgufWeight(parts, kernel=ext, dtype=torch.float32).linear(x, None)
    slow = GgufWeight(parts, dtype=torch.float32)
    again = GgufWeight(parts, dtype=torch.float32)
    err_lines = [line for line in capfd.readouterr().err.splitlines() if line]
    assert len(err_lines) == 1 and "unavailable" in err_lines[0] and "simulated: no compiler" in err_lines[0]
    assert slow.kernel is None and again.kernel is None
    got = slow.linear(x, None)
    want = torch.cat([reference.kernel_matmul(x, k, raw)[0] for k, raw in parts], dim=1)
    size = torch.cat([reference.kernel_matmul(x, k, raw)[1] for k, raw in parts], dim=1)
    assert ((got.double() - want).abs() <= _accumulation_slack(size, IN)).all()
    assert ((got - with_kernel).abs().double() <= 2 * _accumulation_slack(size, IN)).all()
    assert torch.equal(slow[:20].linear(x, None), got[:, :20])


def test_fallback_rows_are_bitwise_batch_invariant(no_extension):
    parts = [("Q6_K", _blocks("Q6_K", 24, IN, 3)), ("Q4_1", _blocks("Q4_1", 8, IN, 4))]
    decoded = [reference.decode(k, raw) for k, raw in parts]
    x = _x(10)[:9]
    alone = torch.cat([fallback_matmul(x[i : i + 1], decoded) for i in range(9)])
    for rows in range(1, 10):
        assert torch.equal(fallback_matmul(x[:rows], decoded), alone[:rows]), f"T={rows}"


# --- the prefill path ----------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_dequantize_to_bf16_is_the_references_values_rounded(ext, kind):
    if "avx512" not in ext.available_isas():
        pytest.skip("the prefill dequantizer is AVX-512 only")
    raw = _blocks(kind, seed=12)
    buf = packing.pack(reference.decode(kind, raw))
    want = reference.dequantize(kind, raw).bfloat16()
    whole = ext.dequantize(buf, packing.KIND_ID[kind], OUT, IN, 0, 100)
    assert torch.equal(whole.view(torch.int16), want.view(torch.int16))
    pieces = torch.cat([ext.dequantize(buf, packing.KIND_ID[kind], OUT, IN, t, 1) for t in range(3)])
    assert torch.equal(pieces, whole), "tile ranges cut the same rows"


@pytest.mark.parametrize("matrix_unit", [True, False])
def test_long_blocks_take_the_bf16_prefill_path_only_with_a_matrix_unit(ext, monkeypatch, matrix_unit):
    """With AMX, long blocks run dequantized bf16 tiles; without, the int8 kernel's rows (the same bits
    as each row alone), which prefilled faster there."""
    from augury.kernels import weight as weight_module

    monkeypatch.setattr(weight_module, "has_matrix_unit", lambda: matrix_unit)
    parts = [("Q4_K", _blocks("Q4_K", 40, IN, 1)), ("Q6_K", _blocks("Q6_K", 29, IN, 2))]
    w = GgufWeight(parts)
    t = weight_module.PREFILL_ROWS + 6
    x = _x(t, seed=13).bfloat16().unsqueeze(0)  # [1, T, in]: one sequence's prefill block
    bias = torch.randn(69, generator=torch.Generator().manual_seed(2)).bfloat16()
    got = w.linear(x, bias)
    want = torch.nn.functional.linear(x, w.dense().bfloat16(), bias)
    assert got.shape == (1, t, 69)
    assert float((got.float() - want.float()).abs().max()) <= 0.02 * float(want.float().abs().max())
    rows_alone = torch.equal(got[0, -5:], w.linear(x[0, -5:], bias))
    assert rows_alone == (not (matrix_unit and w.isa == "avx512")), "the kernel's rows are the rows alone"
    short = w.linear(x[:, : weight_module.PREFILL_ROWS], bias)  # the kernel: rows independent of the block
    assert torch.equal(short[0, :5], w.linear(x[0, :5], bias))


def test_prefill_threshold_is_the_decoders_row_attention_limit():
    """Up to that block length the decoder keeps rows independent of their block; the kernel must too."""
    from augury.kernels.weight import PREFILL_ROWS
    from tests.tiny import random_decoder

    assert random_decoder().row_attention_limit == PREFILL_ROWS


def test_kernel_calls_let_other_python_threads_run(ext):
    """A matmul releases the GIL: the server's event loop must answer while the scheduler thread verifies.

    A Python thread notes the time in a loop while another thread makes one
    long kernel call; holding the GIL would stall that loop for the whole call.
    """
    import threading
    import time

    kind = "Q4_K"
    packed = [packing.pack(reference.decode(kind, _blocks(kind, 4096, 4096)))]
    x = _x(32, 4096)
    args = (packed, [packing.KIND_ID[kind]], [4096], None, "auto")
    ext.linear(x, *args)  # warm
    start = time.perf_counter()
    ext.linear(x, *args)
    call_s = time.perf_counter() - start
    # A long call (about 300 ms) so that the scheduler's preemptions of this
    # thread on a busy 2-core machine (tens of ms) stay well below it.
    big = x.repeat(max(1, int(0.3 / call_s)), 1)
    inside, done = threading.Event(), threading.Event()
    span: list[float] = []

    def verify() -> None:
        span.append(time.perf_counter())  # before `inside`: the watcher counts its first gap from here
        inside.set()
        ext.linear(big, *args)
        span.append(time.perf_counter())
        done.set()

    worker = threading.Thread(target=verify)
    worker.start()
    inside.wait()
    # Gaps from the call's start to the first turn and from the last turn to the loop's end count too: a
    # call that holds the GIL lets this thread run only once it is over, so the loop may begin after it
    # (checked with a ctypes call that keeps the GIL: a 300 ms stall; one that releases it: under 1 ms).
    longest, last = 0.0, span[0]
    while not done.is_set():
        now = time.perf_counter()
        longest, last = max(longest, now - last), now
    longest = max(longest, time.perf_counter() - last)
    worker.join()
    kernel_s = span[1] - span[0]
    assert longest < kernel_s / 2, f"this thread stalled {longest * 1e3:.0f} ms during a {kernel_s * 1e3:.0f} ms kernel call"


def _argmax_rows() -> list[torch.Tensor]:
    """Rows that try every rule of torch.argmax(-1): ties (the first wins), -inf and +inf, +0.0 against
    -0.0, NaN (torch names the first NaN), widths that are not a whole number of 16-value chunks, the
    largest value in a chunk's first and last lane and in the tail, rows read with a stride."""
    g = torch.Generator().manual_seed(5)
    rows = []
    for width in (1, 3, 15, 16, 17, 31, 33, 4099, 151936):
        x = torch.randn(4, width, generator=g)
        rows += [x, x.round(), torch.full((2, width), float("-inf")), torch.zeros(2, width)]
        signed_zeros = torch.zeros(3, width)
        signed_zeros[:, ::2] = -0.0
        rows.append(signed_zeros)
        with_nan = x.clone()
        with_nan[1, width // 2] = float("nan")
        with_nan[2, -1] = float("nan")
        rows.append(with_nan)
        peaks = torch.randn(3, width, generator=g)
        peaks[0, 0] = 99.0
        peaks[1, width - 1] = 99.0
        peaks[2, (width // 16) * 16 - 1 if width >= 16 else 0] = float("inf")
        rows.append(peaks)
    wide = torch.randn(3, 64, generator=g).round()
    rows.append(wide[:, 5:50])  # rows with a stride longer than their width
    return rows


def test_first_largest_names_the_index_torchs_argmax_names(ext):
    """The kernel's greedy pick (csrc/argmax.h) against torch.argmax(-1), the reference: a NaN row comes
    back as -1 from the kernel, and `first_largest` then asks torch for it."""
    from augury.sampling import first_largest

    for x in _argmax_rows():
        want = x.argmax(-1)
        raw = ext.first_largest(x)
        nan_rows = torch.isnan(x).any(-1)
        assert torch.equal(raw[~nan_rows], want[~nan_rows]), (x.shape, raw, want)
        assert bool((raw[nan_rows] == -1).all())
        assert torch.equal(first_largest(x), want), (x.shape, first_largest(x), want)
    with pytest.raises(RuntimeError, match="first_largest needs float32 rows"):
        ext.first_largest(torch.zeros(2, 0))
    with pytest.raises(RuntimeError, match="first_largest needs float32 rows"):
        ext.first_largest(torch.zeros(2, 8, dtype=torch.bfloat16))
    assert torch.equal(first_largest(torch.tensor([[1.0, 3.0, 3.0]], dtype=torch.bfloat16)), torch.tensor([1]))


def test_first_largest_never_builds_the_kernel():
    """A process that never loaded the kernel (no GGUF weights) picks greedy tokens with torch and asks
    nothing of the compiler: in a fresh interpreter, the pick leaves `extension` uncalled."""
    import subprocess
    import sys

    code = ("import torch\n"
            "from augury.sampling import first_largest\n"
            "from augury.kernels import extension as e\n"
            "print(first_largest(torch.tensor([[0.5, 2.0, 2.0, -1.0], [3.0, 1.0, 3.0, 0.0]])).tolist(),"
            " e.extension.cache_info().currsize, e.loaded())\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[1,", "0]", "0", "None"], out
