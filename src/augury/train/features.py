"""The target's view of the corpus: per token its hidden state and its top-k next-token log-probabilities.

One prefill per sequence gives both (the states the head reads, the
distribution it distills). They are written in shards of safetensors, each
complete on its own and renamed into place when whole, so an interrupted
collection keeps every shard it finished.

Per token on disk: the state (H values, bf16), the token id and k (id,
log-probability) pairs: about 2 H + 6 k + 4 bytes (3.1 KB for a 1536-wide
target at k = 8).
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from augury.errors import AuguryError
from augury.models.loader import Model
from augury.proposers.heads import HeadConfig, feature_layers, pick_feature, write_atomic

SHARD_PREFIX = "features-"


@dataclass
class Features:
    """Every collected token, sequences back to back."""

    tokens: Tensor  # [n] long
    offsets: Tensor  # [S + 1] long: sequence s is tokens[offsets[s] : offsets[s + 1]]
    states: Tensor  # [n, H] bf16, the head's input state at each position
    topk_ids: Tensor  # [n, k] long: the target's most likely next tokens at each position
    topk_logprobs: Tensor  # [n, k] fp32, their log-probabilities

    @property
    def num_sequences(self) -> int:
        return self.offsets.numel() - 1

    def span(self, s: int) -> tuple[int, int]:
        return int(self.offsets[s]), int(self.offsets[s + 1])


def no_space(exc: OSError, what: Path, kept: str) -> AuguryError:
    """The one-line error for a failed write (naming a full disk as such)."""
    reason = "no space left on device" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
    return AuguryError(f"writing {what} failed: {reason} ({kept})")


@torch.inference_mode()
def collect(
    target: Model,
    sequences: list[list[int]],
    config: HeadConfig,
    folder: Path,
    *,
    topk: int = 8,
    first_shard: int = 0,
    shard_tokens: int = 32768,
    deadline: float | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[Path]:
    """Prefill each sequence through the target and write shards; returns the shard files written.

    Stops between sequences at the deadline (time.monotonic). progress(tokens) after each sequence.
    """
    decoder = target.decoder
    layers = feature_layers(config, target.config)
    hidden = target.config.hidden_size
    longest = max((len(s) for s in sequences), default=0)
    cache = decoder.new_cache(1, longest + 8)
    written: list[Path] = []
    buffer: dict[str, list[Tensor]] = {"tokens": [], "states": [], "topk_ids": [], "topk_logprobs": []}
    lengths: list[int] = []

    def flush() -> None:
        if not lengths:
            return
        from safetensors.torch import save

        path = folder / f"{SHARD_PREFIX}{first_shard + len(written):05d}.safetensors"
        tensors = {name: torch.cat(parts).contiguous() for name, parts in buffer.items()}
        tensors["lengths"] = torch.tensor(lengths, dtype=torch.int64)
        try:
            write_atomic(path, save(tensors))
        except OSError as exc:
            raise no_space(exc, path, f"the {len(written)} shards written before it are kept") from None
        written.append(path)
        for parts in buffer.values():
            parts.clear()
        lengths.clear()

    for ids in sequences:
        if deadline is not None and time.monotonic() >= deadline:
            break
        if len(ids) < 3:
            continue
        cache.reset()
        tokens = torch.tensor([ids], device=decoder.device)
        out = decoder.forward(tokens, cache, return_hidden=True, hidden_layers=layers)
        logits, states = out
        logits = logits[0]
        top = logits.topk(topk, dim=-1)
        buffer["tokens"].append(torch.tensor(ids, dtype=torch.int32))
        buffer["states"].append(pick_feature(config, states[0], hidden).to(torch.bfloat16).cpu())
        buffer["topk_ids"].append(top.indices.to(torch.int32).cpu())
        buffer["topk_logprobs"].append((top.values - logits.logsumexp(-1, keepdim=True)).to(torch.float16).cpu())
        lengths.append(len(ids))
        if progress is not None:
            progress(len(ids))
        if sum(lengths) >= shard_tokens:
            flush()
    flush()
    return written


def load(shards: list[Path]) -> Features:
    """All shards as one `Features` (in memory: a few hundred MB for an hour's corpus)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    parts: dict[str, list[Tensor]] = {"tokens": [], "states": [], "topk_ids": [], "topk_logprobs": [], "lengths": []}
    for path in shards:
        try:
            loaded = load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise AuguryError(f"feature shard {path} is unreadable ({exc}); delete it to collect again") from None
        for name in parts:
            parts[name].append(loaded[name])
    if not parts["lengths"]:
        raise AuguryError("no training features were collected (the corpus was empty or the time ran out)")
    lengths = torch.cat(parts["lengths"])
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    offsets[1:] = lengths.cumsum(0)
    return Features(
        tokens=torch.cat(parts["tokens"]).long(),
        offsets=offsets,
        states=torch.cat(parts["states"]),
        topk_ids=torch.cat(parts["topk_ids"]).long(),
        topk_logprobs=torch.cat(parts["topk_logprobs"]).float(),
    )
