"""The verification cost curve and the memory-bandwidth floor of one decode step.

Speculative decoding pays off when scoring T new tokens costs about as much as
scoring one. This measures, for one model in each weight format asked for
(the GGUF's own low-bit blocks, dequantized bf16): the forward time of T = 1,
2, 4, ... new tokens after a fixed context, the floor a single-token step
cannot beat (bytes of weights read per step / measured memory bandwidth), and
plain autoregressive tokens/s, next to transformers' generate on the very same
weights and llama.cpp's own `llama-bench` prompt-processing times for T tokens
at the same depth (the same forward in llama.cpp), all in one report.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from augury.costs import forward_curve, weight_bytes_per_step
from augury.models.decoder import OneDnnWeight, onednn_packing_available
from augury.models.loader import Model


@dataclass
class ForwardProfile:
    """One model's curve: `label` names its weight format (gguf, bf16, or as loaded)."""

    label: str
    weight_bytes: int
    context: int
    rows_ms: dict[int, float] = field(default_factory=dict)  # new tokens -> median forward ms
    augury_tps: float | None = None
    transformers_tps: float | None = None

    def floor_ms(self, bandwidth_gbs: float) -> float:
        """The least a decode step can take: every weight byte read once at the measured bandwidth."""
        return self.weight_bytes / (bandwidth_gbs * 1e9) * 1e3


@dataclass
class ProfileReport:
    """Every weight format's curve side by side, with llama.cpp's forward times for the same row counts."""

    bandwidth_by_method: dict[str, float]  # GB/s, each method's median (read_bandwidth_gbs)
    profiles: list[ForwardProfile]
    llama_cpp_ms: dict[int, float] | None = None  # llama-bench pp T at the same depth: ms per forward
    bandwidth_spread: dict[str, tuple[float, float, float]] | None = None  # (min, median, max) GB/s by method
    kernel_path: str | None = None  # which instruction set's kernel and layer ran (AUGURY_ISA or the best here)

    @property
    def bandwidth_gbs(self) -> float:
        return max(self.bandwidth_by_method.values())

    def markdown(self) -> str:
        gbs = self.bandwidth_gbs
        methods = ", ".join(f"{name} {value:.1f}" for name, value in self.bandwidth_by_method.items())
        lines = [f"measured read bandwidth {gbs:.1f} GB/s (the fastest median of: {methods})"]
        if self.bandwidth_spread:
            lines.append("spread (min / median / max GB/s): " + "; ".join(
                f"{name} {lo:.1f} / {mid:.1f} / {hi:.1f}" for name, (lo, mid, hi) in self.bandwidth_spread.items()))
        if self.kernel_path:
            lines.append(f"kernel path: {self.kernel_path}")
        lines += [f"{p.label}: weights read per step {p.weight_bytes / 1e9:.2f} GB; floor {p.floor_ms(gbs):.1f} ms "
                  "per step" for p in self.profiles]
        context = self.profiles[0].context
        headers = [f"new tokens after {context}"]
        for p in self.profiles:
            headers += [f"{p.label} ms", "x one token", "x floor"]
        cpp = self.llama_cpp_ms
        if cpp:
            headers += ["llama.cpp ms", "x one token"]
        lines += ["", "| " + " | ".join(headers) + " |", "|" + "---:|" * len(headers)]
        rows = sorted({r for p in self.profiles for r in p.rows_ms} | set(cpp or {}))
        for r in rows:
            cells = [str(r)]
            for p in self.profiles:
                ms, one = p.rows_ms.get(r), p.rows_ms.get(1)
                cells += _cells(ms, one) + [f"{ms / p.floor_ms(gbs):.2f}" if ms is not None else "—"]
            if cpp:
                cells += _cells(cpp.get(r), cpp.get(1))
            lines.append("| " + " | ".join(cells) + " |")
        for p in self.profiles:
            if p.augury_tps is not None:
                lines += ["", f"augury plain decoding ({p.label}): {p.augury_tps:.2f} tok/s"]
            if p.transformers_tps is not None and p.augury_tps is not None:
                lines.append(
                    f"transformers generate ({p.label}, same weights, same dtype): {p.transformers_tps:.2f} tok/s; "
                    f"ratio {p.augury_tps / p.transformers_tps:.2f}x"
                )
        if cpp:
            lines += ["", "llama.cpp: llama-bench prompt processing of T tokens at the same depth, on the same GGUF "
                      "and thread count (ms per forward: its mean time for the pp T test)"]
        return "\n".join(lines)


def _cells(ms: float | None, one: float | None) -> list[str]:
    if ms is None:
        return ["—", "—"]
    return [f"{ms:.1f}", f"{ms / one:.2f}" if one else "—"]


def read_bandwidth_gbs(
    size_bytes: int = 1 << 30, repeats: int = 9, spread: dict[str, tuple[float, float, float]] | None = None
) -> dict[str, float]:
    """Streaming read bandwidth (GB/s) over a buffer far larger than any cache, by method: the median of
    `repeats` readings.

    No one kernel reads at the machine's peak, so several are timed and the
    floor uses the fastest: an fp32 sum, where oneDNN packing runs a one-row
    bf16 matmul against a 1 GiB weight, and where the GGUF kernel runs a
    one-row Q4_K matmul over 1 GiB of blocks (the very reads a decode step
    does). Each runs on all of torch's threads. Medians, not maxima: on a
    shared machine one reading can be far off, and the best of nine moved the
    floor of one Zen 4 by a third between two runs a minute apart (2026-12-04,
    docs/benchmarks.md 20); a copy is no longer timed, as it also writes, which
    a decode step does not (it read 48 GB/s there against the sum's 33).
    `spread`, when given, receives each method's (min, median, max).
    """

    def samples(fn, nbytes: int) -> list[float]:
        fn()  # first touch
        out = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            out.append(nbytes / (time.perf_counter() - t0) / 1e9)
        return out

    readings: dict[str, list[float]] = {}
    # ones, not empty: untouched pages all map to one zero page and read from cache
    buf = torch.ones(size_bytes // 4, dtype=torch.float32)
    readings["fp32 sum"] = samples(buf.sum, size_bytes)
    if onednn_packing_available(torch.bfloat16, torch.device("cpu")):
        weight = OneDnnWeight(buf.view(torch.bfloat16).view(-1, 4096))
        x = torch.ones(1, 4096, dtype=torch.bfloat16)
        readings["1-row bf16 matmul"] = samples(lambda: weight.linear(x, None), size_bytes)
        del weight
    del buf
    kernel_read = _kernel_reader(size_bytes)
    if kernel_read is not None:
        readings["1-row GGUF kernel"] = samples(kernel_read, size_bytes)
    if spread is not None:
        spread.update({k: (min(v), statistics.median(v), max(v)) for k, v in readings.items()})
    return {k: statistics.median(v) for k, v in readings.items()}


def _kernel_reader(size_bytes: int):
    """A callable streaming about `size_bytes` of Q4_K blocks through the GGUF kernel for one row, or None."""
    from augury.kernels import packing
    from augury.kernels.extension import extension, kernel_isa

    module = extension()
    if module is None:
        return None
    n_in = 4096
    lay = packing.LAYOUTS["Q4_K"]
    tile_bytes = n_in // lay.group_k * lay.group_bytes
    rows = size_bytes // tile_bytes * packing.TILE
    data = torch.zeros(rows // packing.TILE * tile_bytes, dtype=torch.uint8)  # zero quants and scales: any bytes do
    x = torch.ones(1, n_in)
    isa = kernel_isa()
    return lambda: module.linear(x, [data], [packing.KIND_ID["Q4_K"]], [rows], None, isa)


def plain_tokens_per_s(model: Model, prompt_ids: list[int], tokens: int) -> float:
    from augury.engine import Engine
    from augury.sampling import SamplingParams

    result = Engine(model).generate(prompt_ids, SamplingParams(max_tokens=tokens, ignore_eos=True))
    return result.stats.tokens_per_s


def transformers_tokens_per_s(model: Model, prompt_ids: list[int], tokens: int) -> float:
    """transformers' greedy generate on the same tensors, decode speed (prefill excluded)."""
    from augury.bench.peers import HFContender, hf_model_from
    from augury.sampling import SamplingParams

    contender = HFContender("hf", model, hf_model_from(model), k=0)
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    contender.generate([], prompt_ids, SamplingParams(max_tokens=4, ignore_eos=True))  # warm-up
    outcome = contender.generate([], prompt_ids, params)
    return outcome.stats.tokens_per_s


def profile(
    model: Model, label: str, *, context: int, rows: list[int], decode_tokens: int, prompt_ids: list[int],
    transformers: bool,
) -> ForwardProfile:
    """One model's curve and plain decoding speed (and transformers' on the same weights)."""
    result = ForwardProfile(label, weight_bytes_per_step(model), context)
    result.rows_ms = forward_curve(model, context, rows)
    plain_tokens_per_s(model, prompt_ids, 4)  # warm-up
    result.augury_tps = plain_tokens_per_s(model, prompt_ids, decode_tokens)
    if transformers:
        result.transformers_tps = transformers_tokens_per_s(model, prompt_ids, decode_tokens)
    return result
