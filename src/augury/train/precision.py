"""The dtype a head trains in: bf16 where this machine multiplies bf16 faster than fp32, by measurement.

A head's training step is mostly matmuls over a window's rows: the layer's
and the draft vocabulary's output rows. CPUs differ by a factor of several
here: one with AVX-512 BF16 (or AMX) runs oneDNN's bf16 matmul 4-5x faster
than fp32, one with only AVX2 converts bf16 in software and runs it slower.
So `auto` times one matmul of the step's shape in both dtypes at the start
and keeps the faster. bf16 runs under autocast: the parameters, the
optimizer's state and the loss's softmax stay fp32 (only matmul inputs are
rounded), so the same checkpoint resumes in either dtype.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from augury.errors import AuguryError

COMPUTE_DTYPES = ("auto", "fp32", "bf16")
PROBE_ROWS = 512  # a training window's rows
PROBE_OUT = 4096  # a slice of the draft vocabulary's output rows


@dataclass(frozen=True)
class Precision:
    """What the training step computes its matmuls in, and the measurement behind an `auto` choice."""

    dtype: str  # "fp32" or "bf16"
    probe_ms: dict[str, float] = field(default_factory=dict)  # dtype -> ms for the probe matmul (auto only)

    def autocast(self, device: torch.device) -> contextlib.AbstractContextManager:
        """The context a training or evaluation forward runs in."""
        if self.dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device.type, dtype=torch.bfloat16)


def matmul_ms(dtype: torch.dtype, device: torch.device, hidden: int, repeats: int = 3) -> float:
    """Median milliseconds of a [PROBE_ROWS, hidden] x [hidden, PROBE_OUT] matmul in `dtype` (after a warm-up)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(PROBE_ROWS, hidden, generator=gen).to(device, dtype)
    w = torch.randn(PROBE_OUT, hidden, generator=gen).to(device, dtype)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    a @ w.T
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        a @ w.T
        sync()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2] * 1e3


def choose_precision(wanted: str, device: torch.device, hidden: int,
                     timer: Callable[[torch.dtype, torch.device, int], float] = matmul_ms) -> Precision:
    """`wanted` as asked, or for `auto` the faster of fp32 and bf16 on this device by `timer`."""
    if wanted not in COMPUTE_DTYPES:
        raise AuguryError(f"unknown --train-dtype '{wanted}' (choose from {', '.join(COMPUTE_DTYPES)})")
    if wanted != "auto":
        return Precision(wanted)
    times = {"fp32": timer(torch.float32, device, hidden), "bf16": timer(torch.bfloat16, device, hidden)}
    return Precision(min(times, key=times.get), {k: round(v, 3) for k, v in times.items()})
