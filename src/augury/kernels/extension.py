"""Build and load the C++ kernel (csrc/) at first use, cached per machine under $AUGURY_HOME/kernels.

Why at first use and not at install: a build-time `torch` requirement would
make pip's isolated build environment download a multi-GB CUDA torch wheel, and
the extension must match the torch the user actually runs. So the sources ship
as package data and `torch.utils.cpp_extension.load` compiles them with the
installed torch and the system C++ compiler the first time a GGUF model's
native weights are used (tens of seconds, once). The build directory is keyed by
the sources, the torch version and the CPU's flags, so an upgrade or another
machine sharing the home rebuilds instead of loading a stale library.

Any failure (no compiler, no ninja) leaves `import augury` and the
bf16 path untouched: `extension()` returns None and says why in one line.

The library holds the kernel body once per instruction set: AVX-512 VNNI, AVX2
with AVX-VNNI and plain AVX2 on x86, NEON with dot products on aarch64, and
portable C++ (no intrinsics, for any other CPU); `kernel_isa()` picks the best
one the CPU runs.
`AUGURY_ISA=avx512|avxvnni|avx2|neon|portable|torch` forces one (torch: no extension,
the torch fallback), so that one machine can measure and test every path.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
from pathlib import Path
from types import ModuleType

from augury.errors import AuguryError

SOURCES = (
    "gguf_matmul.cpp", "common.h", "kernel_body.h", "layer_body.h", "lanes_body.h", "attention_body.h", "ops_avx2.h", "ops_avxvnni.h", "ops_avx512.h",
    "ops_neon.h", "ops_portable.h", "requantize.h",
)
# The kernel's variants, best first (an x86 or an Arm CPU runs some).
ISAS = ("avx512", "avxvnni", "avx2", "neon", "portable")
ISA_ENV = "AUGURY_ISA"


def forced_isa() -> str | None:
    """The path AUGURY_ISA forces (one of ISAS or "torch"), None when unset; a bad value is a one-line error."""
    value = os.environ.get(ISA_ENV, "").strip().lower()
    if not value or value == "auto":
        return None
    if value not in (*ISAS, "torch"):
        raise AuguryError(f"{ISA_ENV}={value!r} is not a kernel path (choose from {', '.join((*ISAS, 'torch', 'auto'))})")
    return value


def _csrc() -> Path:
    return Path(__file__).parent / "csrc"


def _cpu_flags() -> str:
    """The CPU's feature flags (Linux), else the processor name: part of the build key."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def has_matrix_unit() -> bool:
    """Whether the CPU has a bf16 matrix unit (AMX-BF16) that oneDNN's bf16 matmul uses: the only place
    where long prompts ran faster on dequantized bf16 tiles than on the int8 kernel (weight.py)."""
    return "amx_bf16" in _cpu_flags().split()


def build_key() -> str:
    """Hash of what the built library depends on: sources, torch version, Python version, architecture.

    Not the CPU's flags: the library is built without -march and picks its instruction set when it
    runs (gguf_matmul.cpp), so one build serves every CPU of an architecture, and a VM whose flag list
    changes under it (a new host, microcode) does not wait a minute for a rebuild.
    """
    import torch

    h = hashlib.sha256()
    for name in SOURCES:
        h.update((_csrc() / name).read_bytes())
    h.update(f"{torch.__version__}|{sys.version_info[:2]}|{platform.machine()}".encode())
    return h.hexdigest()[:16]


def build_dir() -> Path:
    from augury.models.store import augury_home

    return augury_home() / "kernels" / f"gguf-{build_key()}"


def _build() -> ModuleType:
    from torch.utils import cpp_extension

    folder = build_dir()
    folder.mkdir(parents=True, exist_ok=True)
    try:  # the ninja wheel's binary, for a venv whose bin/ is not on PATH
        import ninja

        os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])
    except ImportError:
        pass
    if not any(folder.glob("*.so")) and sys.stderr.isatty():  # a person waiting at a terminal, not a log
        print(f"augury: building the GGUF matmul kernel for this machine (once, about half a minute) in {folder}",
              file=sys.stderr, flush=True)
    return cpp_extension.load(
        name=f"augury_gguf_{build_key()}",
        sources=[str(_csrc() / "gguf_matmul.cpp")],
        # no contraction of a * b + c into one fma: the bodies' plain C++ loops then round alike on every ISA
        extra_cflags=["-O3", "-fopenmp", "-ffp-contract=off"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
        verbose=False,
    )


@functools.cache
def extension() -> ModuleType | None:
    """The compiled kernel module, or None (after one line on stderr saying why) where it cannot be built or run."""
    if forced_isa() == "torch":
        print(f"augury: {ISA_ENV}=torch: GGUF blocks run on the torch fallback, not the C++ kernel", file=sys.stderr)
        return None
    try:
        module = _build()
    except Exception as exc:  # noqa: BLE001 - any build problem means: use the fallback
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        print(
            f"augury: the GGUF matmul kernel is unavailable here ({reason[:300]}); GGUF models load dequantized "
            "(bf16) unless weights 'gguf' asks for the slow torch fallback",
            file=sys.stderr,
        )
        return None
    return module


def loaded() -> ModuleType | None:
    """The kernel module where this process has already built or loaded it (`extension`), else None: never
    builds, so code that merely may use the kernel (a greedy row's argmax) costs a torch-only process nothing."""
    return extension() if extension.cache_info().currsize else None


@functools.cache
def kernel_isa() -> str:
    """The kernel variant GGUF matmuls run here: AUGURY_ISA's if set, else the best this CPU runs ("torch"
    where there is no extension). Forcing a variant this CPU cannot run is a one-line error."""
    module = extension()
    if module is None:
        return "torch"
    runs = list(module.available_isas())
    forced = forced_isa()
    if forced is None:
        return runs[0]
    if forced not in runs:
        raise AuguryError(f"{ISA_ENV}={forced} cannot run on this CPU (it runs: {', '.join(runs)})")
    return forced
