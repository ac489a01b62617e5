"""Build and load the C++ kernel (csrc/) at first use, cached per machine under $AUGURY_HOME/kernels.

Why at first use and not at install: a build-time `torch` requirement would
make pip's isolated build environment download a multi-GB CUDA torch wheel, and
the extension must match the torch the user actually runs. So the sources ship
as package data and `torch.utils.cpp_extension.load` compiles them with the
installed torch and the system C++ compiler the first time a GGUF model's
native weights are used (tens of seconds, once). The build directory is keyed by
the sources, the torch version and the CPU's flags, so an upgrade or another
machine sharing the home rebuilds instead of loading a stale library.

Any failure (no compiler, no ninja, an old CPU) leaves `import augury` and the
bf16 path untouched: `extension()` returns None and says why in one line.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import sys
from pathlib import Path
from types import ModuleType

SOURCES = ("gguf_matmul.cpp", "kernel_body.h")


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


def build_key() -> str:
    """Hash of what the built library depends on: sources, torch version, CPU flags, Python version."""
    import torch

    h = hashlib.sha256()
    for name in SOURCES:
        h.update((_csrc() / name).read_bytes())
    h.update(f"{torch.__version__}|{sys.version_info[:2]}|{_cpu_flags()}".encode())
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
        extra_cflags=["-O3", "-fopenmp"],
        extra_ldflags=["-fopenmp"],
        build_directory=str(folder),
        verbose=False,
    )


@functools.cache
def extension() -> ModuleType | None:
    """The compiled kernel module, or None (after one line on stderr saying why) where it cannot be built or run."""
    try:
        module = _build()
        if not module.available_isas():
            raise RuntimeError("this CPU has neither AVX-512 VNNI nor AVX2")
    except Exception as exc:  # noqa: BLE001 - any build problem means: use the fallback
        reason = " ".join(f"{type(exc).__name__}: {exc}".split())
        print(
            f"augury: the GGUF matmul kernel is unavailable here ({reason[:300]}); GGUF models load dequantized "
            "(bf16) unless weights 'gguf' asks for the slow torch fallback",
            file=sys.stderr,
        )
        return None
    return module
