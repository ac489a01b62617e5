"""The kernel and layer bodies built without torch, natively and for aarch64 under qemu-user.

`tests/cross/portable_check.cpp` compiles the same headers the extension does
(src/augury/kernels/csrc, with a two-function stand-in for ATen/Parallel.h) and
runs one matmul over every block format and one decoder layer per architecture
from a file of arrays. Its results must be bitwise the extension's portable
path on this machine (which the kernel tests compare with reference.py). Built
for this CPU, that checks the driver itself; cross-compiled for aarch64 and run
under qemu-user, it checks that the portable variant (the loops vectorised by
the compiler) and the NEON dot-product variant (ops_neon.h) give the same bits
on an Arm CPU. The Arm half needs Debian's g++-aarch64-linux-gnu and qemu-user
(`make cross-tools`) and is skipped, saying so, where they are missing.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from augury.kernels import extension as ext_module
from augury.kernels import packing, reference
from augury.kernels.weight import GgufWeight
from augury.models.native_layers import kernel_matrix
from tests.native_tiny import native_config, native_weights

HERE = Path(__file__).parent / "cross"
CSRC = Path(ext_module.__file__).parent / "csrc"
TYPES = {torch.float32: 0, torch.int64: 1, torch.uint8: 2, torch.bfloat16: 3}
NUMPY = {torch.float32: np.dtype("<f4"), torch.int64: np.dtype("<i8"), torch.uint8: np.dtype("u1"),
         torch.bfloat16: np.dtype("<i2")}
FLAGS = ["-std=c++17", "-O3", "-fopenmp", "-ffp-contract=off", "-Wno-psabi", f"-I{HERE / 'shim'}", f"-I{CSRC}"]
ARM_TOOLS = ("aarch64-linux-gnu-g++", "qemu-aarch64")


@pytest.fixture(scope="module")
def kernel():
    module = ext_module.extension()
    if module is None:
        pytest.skip("the GGUF kernel extension cannot be built here")
    return module


def _write(path: Path, arrays: dict[str, torch.Tensor]) -> None:
    with open(path, "wb") as f:
        for name, t in arrays.items():
            t = t.contiguous()
            raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
            f.write(struct.pack("<I", len(name)) + name.encode() + struct.pack("<Bq", TYPES[t.dtype], t.numel()) + raw)


def _read(path: Path) -> dict[str, torch.Tensor]:
    data, out, at = path.read_bytes(), {}, 0
    dtypes = {code: dtype for dtype, code in TYPES.items()}
    while at < len(data):
        (length,) = struct.unpack_from("<I", data, at)
        name = data[at + 4 : at + 4 + length].decode()
        code, count = struct.unpack_from("<Bq", data, at + 4 + length)
        at += 4 + length + 9
        dtype = dtypes[code]
        raw = NUMPY[dtype]  # bf16 travels as its 16-bit patterns
        values = torch.from_numpy(np.frombuffer(data, dtype=raw, count=count, offset=at).copy())
        out[name] = values.view(dtype)
        at += count * raw.itemsize
    return out


def _matrix(prefix: str, weight: GgufWeight) -> dict[str, torch.Tensor]:
    """The same matrix as records: "<prefix>.kinds", "<prefix>.rows" and "<prefix>.part<i>"."""
    parts, kinds, rows = kernel_matrix(weight)
    return {f"{prefix}.kinds": torch.tensor(kinds), f"{prefix}.rows": torch.tensor(rows),
            **{f"{prefix}.part{i}": part for i, part in enumerate(parts)}}


def _matmul_case(kernel) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Every block format stacked in one matrix (odd row counts: partial tiles), 3 rows, a bias."""
    gen = torch.Generator().manual_seed(5)
    n_in = 512
    parts = [(kind, reference.quantize(kind, torch.randn(16 + 3 * i, n_in, generator=gen) * 0.1))
             for i, kind in enumerate(packing.KIND_ID)]
    weight = GgufWeight(parts, dtype=torch.float32)
    assert all(p.packed for p in weight.parts)
    x = torch.randn(3, n_in, generator=gen)
    bias = torch.randn(weight.shape[0], generator=gen)
    y = kernel.linear(x, *kernel_matrix(weight), bias, isa="portable")
    sent = {"mm.shape": torch.tensor([3, n_in]), "mm.x": x, "mm.bias": bias, **_matrix("mm.w", weight)}
    return sent, {"mm.y": y}


def _layer_case(kernel, arch: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Layer 0 of the tiny model over 5 new rows after 11 cached slots (a sliding window for gemma3, and
    one row attending as a tree node does: a prefix range and then chosen slots)."""
    c = native_config(arch)
    layer = native_weights(arch, torch.float32).layers[0]
    gen = torch.Generator().manual_seed(9)
    rows, slots, past, d = 5, 32, 11, c.head_dim
    x = torch.randn(rows, c.hidden_size, generator=gen)
    keys = torch.randn(c.num_kv_heads, slots, d, generator=gen).to(torch.bfloat16)
    values = torch.randn(c.num_kv_heads, slots, d, generator=gen).to(torch.bfloat16)
    row_slot = torch.arange(past, past + rows)
    key_hi = row_slot + 1
    key_lo = (key_hi - c.sliding_window).clamp(min=0) if c.sliding_window else torch.zeros(rows, dtype=torch.long)
    key_hi[-1] = past  # the last row: the cached prefix, then slots 11, 12 and its own
    extra_slots = torch.tensor([past, past + 1, past + rows - 1])
    extra_off = torch.tensor([0] * rows + [len(extra_slots)])
    angles = torch.rand(rows, d, generator=gen) * 6.0
    cos, sin = angles.cos(), angles.sin()
    scale = float(d) ** -0.5
    optional = {name: getattr(layer, name) for name in ("bqkv", "q_norm", "k_norm", "post_attn_norm", "post_mlp_norm")}
    native = kernel.NativeLayer(
        attn_norm=layer.attn_norm, mlp_norm=layer.mlp_norm,
        qkv=kernel_matrix(layer.wqkv), wo=kernel_matrix(layer.wo), gate_up=kernel_matrix(layer.w_gate_up),
        down=kernel_matrix(layer.w_down), **optional, n_heads=c.num_heads, n_kv=c.num_kv_heads, head_dim=d,
        eps=c.rms_eps, scale=scale, gelu=c.activation == "gelu_tanh", isa="portable",
    )
    sent = {
        "layer.shape": torch.tensor([rows, c.hidden_size, c.num_heads, c.num_kv_heads, d,
                                     int(c.activation == "gelu_tanh"), slots]),
        "layer.eps_scale": torch.tensor([c.rms_eps, scale], dtype=torch.float64).float(),
        "layer.attn_norm": layer.attn_norm, "layer.mlp_norm": layer.mlp_norm,
        **{f"layer.{name}": t for name, t in optional.items() if t is not None},
        **_matrix("layer.qkv", layer.wqkv), **_matrix("layer.wo", layer.wo),
        **_matrix("layer.gate_up", layer.w_gate_up), **_matrix("layer.down", layer.w_down),
        "layer.x": x.clone(), "layer.keys": keys.clone(), "layer.values": values.clone(),
        "layer.row_seq": torch.zeros(rows, dtype=torch.long), "layer.row_slot": row_slot, "layer.key_lo": key_lo,
        "layer.key_hi": key_hi, "layer.extra_off": extra_off, "layer.extra_slots": extra_slots,
        "layer.cos": cos, "layer.sin": sin,
    }
    native.forward(x, [keys], [values], sent["layer.row_seq"], row_slot, key_lo, key_hi, extra_off, extra_slots,
                   cos, sin)
    return sent, {"layer.x": x, "layer.keys": keys, "layer.values": values}


def _build(compiler: str, out: Path, extra: list[str]) -> None:
    command = [compiler, *FLAGS, *extra, str(HERE / "portable_check.cpp"), "-o", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stderr[-3000:]}"


def _argmax_case(kernel) -> tuple[dict, dict]:
    """Rows of 1,000 values (62 chunks of 16 and a tail), with ties, -inf, the peak in the tail, a NaN:
    each row's greedy pick as the extension gives it (tests/test_kernels.py holds that to torch.argmax)."""
    gen = torch.Generator().manual_seed(3)
    rows = torch.randn(6, 1000, generator=gen).round()
    rows[1, ::2] = float("-inf")
    rows[2, 995] = 50.0
    rows[3, 17] = float("nan")
    rows[4] = -0.0
    return ({"argmax.shape": torch.tensor(list(rows.shape)), "argmax.rows": rows},
            {"argmax.index": kernel.first_largest(rows)})


@pytest.fixture(scope="module")
def cases(kernel):
    return ([("matmul", *_matmul_case(kernel))] + [(arch, *_layer_case(kernel, arch)) for arch in ("qwen2", "gemma3")]
            + [("argmax", *_argmax_case(kernel))])


def _check(binary: list[str], isa: str, cases, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    for name, sent, expected in cases:
        src, dst = tmp_path / f"{name}.in", tmp_path / f"{name}-{isa}.out"
        _write(src, sent)
        done = subprocess.run([*binary, isa, str(src), str(dst)], capture_output=True, text=True, timeout=600, env=env)
        assert done.returncode == 0, f"{isa}, {name}: {done.stderr[-2000:]}"
        got = _read(dst)
        assert sorted(got) == sorted(expected), name
        for key, want in expected.items():
            assert torch.equal(got[key], want.reshape(-1)), f"{isa}, {name}: {key} differs from the extension's portable path"


def test_the_torch_free_build_gives_the_extensions_bits(cases, tmp_path):
    """Built for this CPU: the driver, its stand-in for ATen's threads, and the record files are sound."""
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler here")
    _build(compiler, tmp_path / "check", [])
    _check([str(tmp_path / "check")], "portable", cases, tmp_path)


@pytest.mark.parametrize("isa", ["portable", "neon"])
def test_aarch64_variants_give_the_same_bits(isa, cases, arm_binary, tmp_path):
    """Cross-compiled for aarch64 and run under qemu-user (whose default CPU has the dot-product
    instructions), two threads."""
    _check([ARM_TOOLS[1], str(arm_binary)], isa, cases, tmp_path)


@pytest.fixture(scope="module")
def arm_binary(tmp_path_factory) -> Path:
    missing = [tool for tool in ARM_TOOLS if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not installed (Debian: g++-aarch64-linux-gnu qemu-user; make cross-tools)")
    binary = tmp_path_factory.mktemp("arm") / "check"
    _build(ARM_TOOLS[0], binary, ["-static"])
    return binary


def test_the_extension_compiles_for_aarch64():
    """gguf_matmul.cpp with its aarch64 dispatch (hwcaps, the NEON variant) passes the cross compiler's
    front end against this machine's torch and Python headers: a syntax and type check, not a build."""
    if shutil.which(ARM_TOOLS[0]) is None:
        pytest.skip(f"{ARM_TOOLS[0]} not installed (Debian: g++-aarch64-linux-gnu; make cross-tools)")
    import sysconfig

    from torch.utils import cpp_extension

    includes = [f"-I{p}" for p in [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]]
    command = [ARM_TOOLS[0], "-std=c++17", "-fsyntax-only", "-fopenmp", "-Wno-psabi", "-DTORCH_EXTENSION_NAME=check",
               *includes, str(CSRC / "gguf_matmul.cpp")]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
