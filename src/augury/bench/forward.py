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

    bandwidth_by_method: dict[str, float]  # GB/s
    profiles: list[ForwardProfile]
    llama_cpp_ms: dict[int, float] | None = None  # llama-bench pp T at the same depth: ms per forward

    @property
    def bandwidth_gbs(self) -> float:
        return max(self.bandwidth_by_method.values())

    def markdown(self) -> str:
        gbs = self.bandwidth_gbs
        methods = ", ".join(f"{name} {value:.1f}" for name, value in self.bandwidth_by_method.items())
        lines = [f"measured read bandwidth {gbs:.1f} GB/s (best of: {methods})"]
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


def read_bandwidth_gbs(size_bytes: int = 1 << 30, repeats: int = 5) -> dict[str, float]:
    """Best-of-N streaming read bandwidth (GB/s) over a buffer far larger than any cache, by method.

    No one kernel reads at the machine's peak, so three are timed and the floor
    uses the fastest: an fp32 sum, a copy (which moves every byte twice), and
    where oneDNN packing runs a one-row bf16 matmul against a 1 GiB weight (the
    very kind of read a decode step does; on the development machine it
    streamed about 1.5x faster than the sum).
    """

    def best_seconds(fn) -> float:
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best

    # ones, not empty: untouched pages all map to one zero page and read from cache
    buf = torch.ones(size_bytes // 4, dtype=torch.float32)
    out = {"fp32 sum": size_bytes / best_seconds(buf.sum) / 1e9}
    dst = torch.empty_like(buf)
    out["copy"] = 2 * size_bytes / best_seconds(lambda: dst.copy_(buf)) / 1e9
    del dst
    if onednn_packing_available(torch.bfloat16, torch.device("cpu")):
        weight = OneDnnWeight(buf.view(torch.bfloat16).view(-1, 4096))
        del buf
        x = torch.ones(1, 4096, dtype=torch.bfloat16)
        out["1-row bf16 matmul"] = size_bytes / best_seconds(lambda: weight.linear(x, None)) / 1e9
    return out


def weight_bytes_per_step(model: Model) -> int:
    """Bytes of weights one decode step must read: every layer matrix plus the output head."""
    w = model.decoder.weights
    total = 0
    for layer in w.layers:
        for value in vars(layer).values():
            if value is not None:
                total += value.nbytes
    return total + w.lm_head.nbytes + w.final_norm.nbytes


def forward_curve(model: Model, context: int, rows: list[int], repeats: int = 5) -> dict[int, float]:
    """Median ms of a forward of T new tokens after `context` cached tokens, for each T."""
    decoder = model.decoder
    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    cache = decoder.new_cache(1, context + max(rows) + 8)
    decoder.forward(torch.randint(0, vocab, (1, context), generator=gen), cache, logits_rows=slice(-1, None))
    out = {}
    for t in rows:
        block = torch.randint(0, vocab, (1, t), generator=gen)
        times = []
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            decoder.forward(block, cache)
            elapsed = time.perf_counter() - t0
            cache.truncate(context)
            if i:  # the first is a warm-up
                times.append(elapsed)
        out[t] = statistics.median(times) * 1e3
    return out


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
