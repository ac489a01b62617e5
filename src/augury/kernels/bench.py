"""Micro-benchmark: one forward's matmuls of a GGUF model on its native blocks, by activation row count.

    python -m augury.kernels.bench MODEL [--rows 1,2,4,5,8,16,32] [--bf16]

Times every layer's four matmuls plus the output head (what a decode or
verification step multiplies), over the real weights of every layer so that
the bytes stream from DRAM as in a real step, and reports ms and the weight
read rate. With --bf16 it times the same matrices dequantized to bf16 in
oneDNN's packed layout (today's `--weights bf16` path) in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from augury.models.decoder import LINEAR_FIELDS, OneDnnWeight, linear


def _step(mats: list, widths: list[int], rows: int, dtype: torch.dtype) -> Callable[[], None]:
    gen = torch.Generator().manual_seed(0)
    # [1, rows, in]: one sequence's block, as the decoder passes it (long blocks take the prefill path)
    xs = {w: torch.randn(1, rows, w, generator=gen).to(dtype) for w in set(widths)}

    def run() -> None:
        for m, w in zip(mats, widths):
            linear(xs[w], m)

    return run


def time_step(
    mats: list, rows_list: list[int], dtype: torch.dtype, repeats: int = 5, clock=time.perf_counter
) -> dict[int, float]:
    """Median ms of one pass over all `mats` for each row count (clock: wall time, or process CPU time
    divided by the threads, which on a busy shared machine leaves out the time other processes ran)."""
    widths = [m.shape[1] for m in mats]
    out = {}
    for rows in rows_list:
        run = _step(mats, widths, rows, dtype)
        run()
        times = []
        for _ in range(repeats):
            t0 = clock()
            run()
            times.append(clock() - t0)
        out[rows] = statistics.median(times) * 1e3
    return out


def model_matrices(path: str) -> list:
    """Every layer's matmul weights and the output head of a GGUF file, as `GgufWeight`s."""
    from pathlib import Path

    from augury.models import gguf

    reader = gguf.open_gguf(Path(path))
    config = gguf.read_config(reader, Path(path))
    flat = gguf.read_native_weights(reader, config, Path(path), torch.bfloat16)
    mats = [flat[f"layers.{i}.{name}"] for i in range(config.num_layers) for name in LINEAR_FIELDS]
    return mats + [flat["lm_head"]]


def report(name: str, mats: list, curve: dict[int, float]) -> str:
    nbytes = sum(m.nbytes for m in mats)
    one = curve[min(curve)]
    lines = [f"{name}: {nbytes / 1e9:.3f} GB of weights per step"]
    for rows, ms in curve.items():
        lines.append(f"  rows {rows:3d}: {ms:7.1f} ms  {nbytes / ms / 1e6:6.1f} GB/s  x{ms / one:.2f} of one row")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    from augury.models.store import resolve

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--rows", default="1,2,4,5,8,16,32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--bf16", action="store_true", help="also time the dequantized bf16 oneDNN path")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cpu-time", action="store_true", help="time by process CPU time / threads (busy machines)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = (lambda: time.process_time() / args.threads) if args.cpu_time else time.perf_counter
    rows = [int(r) for r in args.rows.split(",")]
    t0 = time.perf_counter()
    mats = model_matrices(str(resolve(args.model, offline=True)))
    print(f"loaded and repacked in {time.perf_counter() - t0:.1f} s; kernel path {mats[0].isa}")
    print(report("gguf kernel", mats, time_step(mats, rows, torch.bfloat16, args.repeats, clock)), flush=True)
    if args.bf16:
        dense = []
        while mats:
            dense.append(OneDnnWeight(mats.pop(0).dense()))
        print(report("bf16 oneDNN", dense, time_step(dense, rows, torch.bfloat16, args.repeats, clock)))


if __name__ == "__main__":
    main()
