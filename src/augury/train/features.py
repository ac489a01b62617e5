"""The target's view of the corpus: per token its hidden state and its top-k next-token log-probabilities.

Text the target writes itself comes with its states: the step hands every
committed position's states to a proposer that asks (`corpus.StateRecorder`),
and the top-k follows from the final normed state through the output head.
Other text (--data) takes one target prefill per sequence. Both are written in
shards of safetensors, each complete on its own and renamed into place when
whole, so an interrupted collection keeps every shard it finished.

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

from augury.cache import slots_for
from augury.errors import AuguryError
from augury.files import write_atomic
from augury.models.head import HeadConfig, feature_layers, pick_feature
from augury.models.loader import Model

SHARD_PREFIX = "features-"


@dataclass
class Features:
    """Every collected token, sequences back to back."""

    tokens: Tensor  # [n] long
    offsets: Tensor  # [S + 1] long: sequence s is tokens[offsets[s] : offsets[s + 1]]
    states: Tensor  # [n, H] bf16, the head's input state at each position
    topk_ids: Tensor  # [n, k] long: the target's most likely next tokens at each position
    topk_logprobs: Tensor  # [n, k] fp32, their log-probabilities
    starts: Tensor  # [S] long: where each sequence's answer begins (the positions a drafter drafts at)

    @property
    def num_sequences(self) -> int:
        return self.offsets.numel() - 1

    def span(self, s: int) -> tuple[int, int]:
        return int(self.offsets[s]), int(self.offsets[s + 1])


def no_space(exc: OSError, what: Path, kept: str) -> AuguryError:
    """The one-line error for a failed write (naming a full disk as such)."""
    reason = "no space left on device" if exc.errno == errno.ENOSPC else exc.strerror or str(exc)
    return AuguryError(f"writing {what} failed: {reason} ({kept})")


class ShardWriter:
    """Buffers per-sequence features and writes a shard whenever enough tokens have gathered."""

    def __init__(self, folder: Path, first_shard: int = 0, shard_tokens: int = 32768) -> None:
        self.folder, self.first_shard, self.shard_tokens = folder, first_shard, shard_tokens
        self.written: list[Path] = []
        self.buffer: dict[str, list[Tensor]] = {"tokens": [], "states": [], "topk_ids": [], "topk_logprobs": []}
        self.lengths: list[int] = []
        self.starts: list[int] = []

    def add(self, tokens: list[int], states: Tensor, topk_ids: Tensor, topk_logprobs: Tensor, start: int = 0) -> None:
        """One sequence: tokens [L], states [L, H], the target's top-k ids and log-probabilities [L, k];
        start: the first position of the text a drafter would draft (the answer after a prompt; 0: all)."""
        self.buffer["tokens"].append(torch.tensor(tokens, dtype=torch.int32))
        self.buffer["states"].append(states.to(torch.bfloat16).cpu())
        self.buffer["topk_ids"].append(topk_ids.to(torch.int32).cpu())
        self.buffer["topk_logprobs"].append(topk_logprobs.to(torch.float16).cpu())
        self.lengths.append(len(tokens))
        self.starts.append(start)
        if sum(self.lengths) >= self.shard_tokens:
            self.flush()

    def flush(self) -> list[Path]:
        """Write what is buffered (if anything); returns every shard written so far."""
        if not self.lengths:
            return self.written
        from safetensors.torch import save

        path = self.folder / f"{SHARD_PREFIX}{self.first_shard + len(self.written):05d}.safetensors"
        tensors = {name: torch.cat(parts).contiguous() for name, parts in self.buffer.items()}
        tensors["lengths"] = torch.tensor(self.lengths, dtype=torch.int64)
        tensors["starts"] = torch.tensor(self.starts, dtype=torch.int64)
        try:
            write_atomic(path, save(tensors))
        except OSError as exc:
            raise no_space(exc, path, f"the {len(self.written)} shards written before it are kept") from None
        self.written.append(path)
        for parts in self.buffer.values():
            parts.clear()
        self.lengths.clear()
        self.starts.clear()
        return self.written


def top_k(target: Model, final: Tensor, k: int, rows: int = 256) -> tuple[Tensor, Tensor]:
    """The target's top-k next tokens and their log-probabilities [L, k] from its final normed states [L, H]."""
    ids, logprobs = [], []
    for i in range(0, final.shape[0], rows):  # rows at a time: a row of logits is 0.6 MB at 151,936 tokens
        logits = target.decoder.project(final[None, i : i + rows].to(target.decoder.dtype))[0]
        top = logits.topk(k, dim=-1)
        ids.append(top.indices)
        logprobs.append(top.values - logits.logsumexp(-1, keepdim=True))
    return torch.cat(ids), torch.cat(logprobs)


def add_recorded(writer: ShardWriter, target: Model, config: HeadConfig, tokens: list[int], hidden: Tensor,
                 k: int, start: int = 0) -> int:
    """A sequence whose target states were recorded while it was written (`corpus.StateRecorder`).

    hidden: [n, H'] the states of tokens[:n] as the target's steps handed them over (its final normed
    state last); the top-k comes from that final state through the target's output head, which is
    what its logits were. Returns the tokens added (n).
    """
    n = hidden.shape[0]
    if n < 3:
        return 0
    width = target.config.hidden_size
    with torch.inference_mode():
        ids, logprobs = top_k(target, hidden[:, -width:], k)
    writer.add(tokens[:n], pick_feature(config, hidden, width), ids, logprobs, start)
    return n


def length_batches(lengths: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices grouped into prefill batches of similar length (shortest first), each at most batch_tokens
    padded tokens (or one sequence), so that padding wastes little of a batched prefill."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[i] <= batch_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


@torch.inference_mode()
def collect(
    target: Model,
    sequences: list[list[int]],
    config: HeadConfig,
    writer: ShardWriter,
    *,
    starts: list[int] | None = None,
    topk: int = 8,
    batch_tokens: int = 512,
    deadline: float | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """The target's states and top-k over text it did not write: teacher-forced, batched prefill.

    Sequences of similar length share one forward, right-padded: attention is
    causal, so a real position never sees the padding after it, and its state
    is what the sequence's own prefill gives (to the matmuls' summation order).
    Stops between batches at the deadline (time.monotonic); progress(tokens, sequences) after each batch.
    starts: per sequence, where its drafted text (the answer) begins (default 0).
    """
    decoder = target.decoder
    layers = feature_layers(config, target.config)
    hidden = target.config.hidden_size
    kept = [i for i, ids in enumerate(sequences) if len(ids) >= 3]
    batches = length_batches([len(sequences[i]) for i in kept], batch_tokens)
    for batch in batches:
        if deadline is not None and time.monotonic() >= deadline:
            break
        rows = [sequences[kept[i]] for i in batch]
        longest = max(len(ids) for ids in rows)
        padded = torch.tensor([ids + [ids[-1]] * (longest - len(ids)) for ids in rows], device=decoder.device)
        cache = decoder.new_cache(len(rows), slots_for(longest))
        # no logits here: the top-k is taken from the states below, a few hundred rows at a time
        _, states = decoder.forward_states(padded, cache, logits_rows=slice(0, 0), states=layers)
        for b, i in enumerate(batch):
            n = len(rows[b])
            ids, logprobs = top_k(target, states[b, :n, -hidden:], topk)
            writer.add(rows[b], pick_feature(config, states[b, :n], hidden), ids, logprobs,
                       starts[kept[i]] if starts is not None else 0)
        if progress is not None:
            progress(sum(len(ids) for ids in rows), len(rows))


def load(shards: list[Path]) -> Features:
    """All shards as one `Features` (in memory: a few hundred MB for an hour's corpus)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    names = ("tokens", "states", "topk_ids", "topk_logprobs", "lengths")
    parts: dict[str, list[Tensor]] = {name: [] for name in (*names, "starts")}
    for path in shards:
        try:
            loaded = load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise AuguryError(f"feature shard {path} is unreadable ({exc}); delete it to collect again") from None
        for name in names:
            parts[name].append(loaded[name])
        parts["starts"].append(loaded.get("starts", torch.zeros_like(loaded["lengths"])))
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
        starts=torch.cat(parts["starts"]),
    )
