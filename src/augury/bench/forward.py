"""The verification cost curve and the memory-bandwidth floor of one decode step.

Speculative decoding pays off when scoring T new tokens costs about as much as
scoring one. This measures, for one model: the forward time of T = 1, 2, 4, ...
new tokens after a fixed context, the floor a single-token step cannot beat
(bytes of weights read per step / measured memory bandwidth), and plain
autoregressive tokens/s next to transformers' generate on the very same
weights, in the same process.
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
    weight_bytes: int
    bandwidth_by_method: dict[str, float]  # GB/s
    context: int
    rows_ms: dict[int, float] = field(default_factory=dict)  # new tokens -> median forward ms
    augury_tps: float | None = None
    transformers_tps: float | None = None

    @property
    def bandwidth_gbs(self) -> float:
        return max(self.bandwidth_by_method.values())

    @property
    def floor_ms(self) -> float:
        return self.weight_bytes / (self.bandwidth_gbs * 1e9) * 1e3

    def markdown(self) -> str:
        one = self.rows_ms.get(1)
        methods = ", ".join(f"{name} {gbs:.1f}" for name, gbs in self.bandwidth_by_method.items())
        lines = [
            f"weights read per step: {self.weight_bytes / 1e9:.2f} GB; measured read bandwidth "
            f"{self.bandwidth_gbs:.1f} GB/s (best of: {methods}); floor {self.floor_ms:.1f} ms per step",
            "",
            f"| new tokens after {self.context} | forward ms | x one token | x floor |",
            "|---:|---:|---:|---:|",
        ]
        for rows, ms in self.rows_ms.items():
            lines.append(f"| {rows} | {ms:.1f} | {ms / one:.2f} | {ms / self.floor_ms:.2f} |")
        if self.augury_tps is not None:
            lines += ["", f"augury plain decoding: {self.augury_tps:.2f} tok/s"]
        if self.transformers_tps is not None:
            lines.append(
                f"transformers generate (same weights, same dtype): {self.transformers_tps:.2f} tok/s; "
                f"ratio {self.augury_tps / self.transformers_tps:.2f}x"
            )
        return "\n".join(lines)


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
    model: Model, *, context: int, rows: list[int], decode_tokens: int, prompt_ids: list[int], peers: bool
) -> ForwardProfile:
    result = ForwardProfile(weight_bytes_per_step(model), read_bandwidth_gbs(), context)
    result.rows_ms = forward_curve(model, context, rows)
    plain_tokens_per_s(model, prompt_ids, 4)  # warm-up
    result.augury_tps = plain_tokens_per_s(model, prompt_ids, decode_tokens)
    if peers:
        result.transformers_tps = transformers_tokens_per_s(model, prompt_ids, decode_tokens)
    return result
