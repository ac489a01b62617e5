"""KV cache: preallocated per layer, one length pointer per sequence.

Speculative decoding writes K/V for every drafted token and then keeps only the
accepted prefix. Rollback therefore has to be free: the cache never moves data
on truncate, it only moves each sequence's length pointer back, and the next
forward overwrites the stale slots. Slot j of a sequence always holds the token
at position j of that sequence, so positions can be derived from slots.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor

# Slots a cache keeps past the longest sequence it is sized for: the last block (a draft and its
# verification, a drafter's catch-up) is written there before it is truncated. Generous, since a
# slot is cheap next to the weights and a block that does not fit raises; more than step.MAX_K + 1.
SLACK = 64
# Slots a drafter keeps free when it decides how far it may still draft (a catch-up comes first).
DRAFT_MARGIN = 16


def slots_for(tokens: int, growth: int = 0) -> int:
    """The length of a cache for a sequence of `tokens` that may grow by `growth`, with `SLACK` past it.

    (The decoder's `new_cache` adds its own room for padding rows on top.)
    """
    return tokens + growth + SLACK


def draft_room(max_len: int, length: int) -> int:
    """Tokens a drafter may still draft into a cache of max_len slots once it holds `length` tokens."""
    return max(0, max_len - length - DRAFT_MARGIN)


class LayerCache(Protocol):
    """What the decoder's layers ask of a cache (KVCache, CacheGroup and GrowingCache provide it).

    Row-by-row attention also reads `row_kv`/`sequence_kv` (KVCache, CacheGroup);
    masked attention reads `view` (KVCache, GrowingCache).
    """

    @property
    def lengths(self) -> list[int]: ...

    def write(self, layer: int, k_new: Tensor, v_new: Tensor) -> None: ...

    def view(self, layer: int, length: int) -> tuple[Tensor, Tensor]: ...

    def advance(self, n: int) -> None: ...

    def check_room(self, n: int) -> None: ...


RAGGED_ROWS_ONE_BY_ONE = 8  # up to this many rows of different lengths, `KVCache.write` copies row by row


class KVCache:
    """Keys and values for a batch of sequences with their own lengths.

    keys[layer], values[layer]: [B, H_kv, max_len, D], views of all_keys and
    all_values [layers, B, H_kv, max_len, D]. `lengths[b]` is the number of
    valid slots of sequence b; slots at or beyond it are garbage.
    """

    def __init__(
        self,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        max_len: int,
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ) -> None:
        # One tensor a kind for every layer, [layers, B, H_kv, max_len, D], and each layer's view of it:
        # moving or filling a sequence's rows is then one copy for all layers, not one a layer (a
        # scheduler admitting a prompt from the prefix cache paid 2 x 28 copies, docs/benchmarks.md 41).
        shape = (num_layers, batch_size, num_kv_heads, max_len, head_dim)
        self._set_storage(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
        self.max_len = max_len
        # One length list per pool; a view of rows (see `rows`) reads and
        # writes its slice of it, so a pool's lengths are always current.
        self._all_lengths: list[int] = [0] * batch_size
        self._span = (0, batch_size)

    def _set_storage(self, all_keys: Tensor, all_values: Tensor) -> None:
        """all_keys, all_values: [layers, B, H_kv, max_len, D]; keys[layer] and values[layer] are views of them."""
        self.all_keys, self.all_values = all_keys, all_values
        self.keys, self.values = list(all_keys.unbind(0)), list(all_values.unbind(0))
        self._sequence_kv: list[tuple[list[Tensor], list[Tensor]] | None] = [None] * len(self.keys)
        self._views: dict[tuple[int, int], KVCache] = {}  # rows(start, stop), made once each

    @property
    def lengths(self) -> list[int]:
        """Valid slots per sequence (a copy: change it through advance, truncate, reset)."""
        start, stop = self._span
        return self._all_lengths[start:stop]

    @lengths.setter
    def lengths(self, values: list[int]) -> None:
        start, stop = self._span
        if len(values) != stop - start:
            raise ValueError(f"{len(values)} lengths for a cache of {stop - start} sequences")
        self._all_lengths[start:stop] = values

    @property
    def batch_size(self) -> int:
        start, stop = self._span
        return stop - start

    def write(self, layer: int, k_new: Tensor, v_new: Tensor) -> None:
        """Store a block of new K/V right after each sequence's current length.

        k_new, v_new: [B, H_kv, T, D]. Lengths are not advanced here; the
        decoder calls `advance(T)` once after all layers wrote.
        """
        t = k_new.shape[2]
        keys, values = self.keys[layer], self.values[layer]
        if all(n == self.lengths[0] for n in self.lengths):
            start = self.lengths[0]
            keys[:, :, start : start + t] = k_new
            values[:, :, start : start + t] = v_new
            return
        if len(self.lengths) <= RAGGED_ROWS_ONE_BY_ONE:
            for b, start in enumerate(self.lengths):
                keys[b, :, start : start + t] = k_new[b]
                values[b, :, start : start + t] = v_new[b]
            return
        # Many rows of different lengths: one indexed copy per tensor, not one per row (on a GPU a
        # 512-row step paid 2 x 512 small copies a layer). The rows' slots [B, T] index dims 0 and 2,
        # so the copied block is laid out [B, T, H_kv, D].
        rows = torch.arange(len(self.lengths), device=keys.device)[:, None]
        slots = torch.tensor(self.lengths, device=keys.device)[:, None] + torch.arange(t, device=keys.device)
        keys[rows, :, slots] = k_new.transpose(1, 2)
        values[rows, :, slots] = v_new.transpose(1, 2)

    def row_kv(self, layer: int, b: int) -> tuple[Tensor, Tensor]:
        """Sequence b's keys and values of one layer: two [1, H_kv, max_len, D] views."""
        return self.keys[layer][b : b + 1], self.values[layer][b : b + 1]

    def sequence_kv(self, layer: int) -> tuple[list[Tensor], list[Tensor]]:
        """Every sequence's keys and values of one layer, as lists of [H_kv, max_len, D] views (the native layer's
        form; read them, do not change them). Made once per storage: every forward asks for every layer's, and
        unbinding a 16-sequence pool's 28 layers again each step took 0.35 ms on a Zen 5 (docs/benchmarks.md 42)."""
        made = self._sequence_kv[layer]
        if made is None:
            made = self._sequence_kv[layer] = (list(self.keys[layer].unbind(0)), list(self.values[layer].unbind(0)))
        return made

    def view(self, layer: int, length: int) -> tuple[Tensor, Tensor]:
        """The first `length` slots of every sequence: two [B, H_kv, length, D] views."""
        return self.keys[layer][:, :, :length], self.values[layer][:, :, :length]

    def advance(self, n: int) -> None:
        """Every sequence gained n slots (written by the forward that just ran)."""
        self.lengths = [length + n for length in self.lengths]

    def truncate(self, lengths: list[int] | int) -> None:
        """Roll back to the given lengths in O(1): stale slots are simply overwritten later."""
        if isinstance(lengths, int):
            lengths = [lengths] * self.batch_size
        for old, new in zip(self.lengths, lengths):
            if new > old or new < 0:
                raise ValueError(f"cannot truncate a sequence of length {old} to {new}")
        self.lengths = list(lengths)

    def reset(self) -> None:
        """Forget every sequence (keeps the allocation)."""
        self.lengths = [0] * self.batch_size

    def rows(self, start: int, stop: int) -> "KVCache":
        """Sequences start..stop-1 as a cache of their own that shares this one's storage.

        A batching scheduler keeps its running sequences in the first rows of
        one preallocated pool and runs each step on a view of just those rows:
        forwards write straight into the pool, nothing is copied. The view's
        lengths are the pool's lengths of those rows (writing one writes both).
        A view holds nothing else that changes, so each (start, stop) is made
        once and handed out again: a scheduler asks for one every step, and its
        layers' views (`sequence_kv`) then need not be made again either.
        """
        if not 0 <= start <= stop <= self.batch_size:
            raise ValueError(f"rows {start}..{stop} outside a cache of {self.batch_size} sequences")
        view = self._views.get((start, stop))
        if view is not None:
            return view
        view = object.__new__(KVCache)
        view._set_storage(self.all_keys[:, start:stop], self.all_values[:, start:stop])
        view.max_len = self.max_len
        view._all_lengths = self._all_lengths
        base = self._span[0]
        view._span = (base + start, base + stop)
        self._views[(start, stop)] = view
        return view

    def move_row(self, src: int, dst: int) -> None:
        """Copy sequence src's valid slots and length into row dst (a batch closing a hole)."""
        n = self.lengths[src]
        self.all_keys[:, dst, :, :n] = self.all_keys[:, src, :, :n]
        self.all_values[:, dst, :, :n] = self.all_values[:, src, :, :n]
        lengths = self.lengths
        lengths[dst] = n
        self.lengths = lengths

    def copy_rows(self, b: int, start: int, stop: int) -> tuple[Tensor, Tensor]:
        """Sequence b's keys and values of slots start..stop-1, copied out: two [layers, H_kv, stop - start, D].

        A prefix cache keeps them after the sequence's row is reused.
        """
        if not 0 <= start <= stop <= self.lengths[b]:
            raise ValueError(f"slots {start}..{stop} outside sequence {b}'s {self.lengths[b]} valid slots")
        keys = self.all_keys[:, b, :, start:stop].clone(memory_format=torch.contiguous_format)
        values = self.all_values[:, b, :, start:stop].clone(memory_format=torch.contiguous_format)
        return keys, values

    def fill(self, b: int, keys: Tensor, values: Tensor) -> None:
        """Make sequence b hold exactly the given rows in slots 0..n-1. keys, values: [layers, H_kv, n, D].

        A prefix cache's rows for a new sequence's start; the rest of its prompt is prefilled after them.
        """
        n = keys.shape[2]
        if keys.shape[0] != len(self.keys) or n > self.max_len:
            raise ValueError(f"{keys.shape[0]} layers of {n} rows do not fit a cache of {len(self.keys)} layers "
                             f"of {self.max_len} slots")
        self.all_keys[:, b, :, :n] = keys
        self.all_values[:, b, :, :n] = values
        lengths = self.lengths
        lengths[b] = n
        self.lengths = lengths

    def check_room(self, n: int) -> None:
        """Raise if any sequence cannot take n more slots."""
        longest = max(self.lengths) + n
        if longest > self.max_len:
            raise ValueError(f"KV cache full: need {longest} slots, have {self.max_len}")


class CacheGroup:
    """Single-sequence caches of different sizes run as one batch, without copying them.

    A drafter keeps one cache per sequence (sequences come and go at any time);
    to draft for several sequences in one forward it groups their caches. The
    decoder sees the same interface as `KVCache` for blocks it attends row by
    row (up to its row-attention limit), which is all a drafter feeds in a batch.
    """

    def __init__(self, caches: list[KVCache]) -> None:
        if any(c.batch_size != 1 for c in caches):
            raise ValueError("a cache group is made of single-sequence caches")
        self.caches = caches
        self.max_len = min(c.max_len for c in caches)

    @property
    def lengths(self) -> list[int]:
        return [c.lengths[0] for c in self.caches]

    @property
    def batch_size(self) -> int:
        return len(self.caches)

    def write(self, layer: int, k_new: Tensor, v_new: Tensor) -> None:
        """k_new, v_new: [B, H_kv, T, D], row b into cache b."""
        for b, cache in enumerate(self.caches):
            cache.write(layer, k_new[b : b + 1], v_new[b : b + 1])

    def row_kv(self, layer: int, b: int) -> tuple[Tensor, Tensor]:
        return self.caches[b].row_kv(layer, 0)

    def sequence_kv(self, layer: int) -> tuple[list[Tensor], list[Tensor]]:
        return [c.keys[layer][0] for c in self.caches], [c.values[layer][0] for c in self.caches]

    def view(self, layer: int, length: int) -> tuple[Tensor, Tensor]:
        raise ValueError("a cache group serves only blocks attended row by row; feed long blocks one sequence at a time")

    def advance(self, n: int) -> None:
        for cache in self.caches:
            cache.advance(n)

    def truncate(self, lengths: list[int] | int) -> None:
        if isinstance(lengths, int):
            lengths = [lengths] * self.batch_size
        for cache, length in zip(self.caches, lengths):
            cache.truncate([length])

    def check_room(self, n: int) -> None:
        for cache in self.caches:
            cache.check_room(n)


class GrowingCache:
    """A KV cache for training a head: every block's keys and values are concatenated, never written in place.

    `KVCache` overwrites preallocated slots, which autograd cannot
    differentiate through once later blocks write the same storage; training
    unrolls several blocks per step, so it grows tensors instead. Every
    sequence of a batch has the same length here, and a head has one layer.
    """

    def __init__(self, batch_size: int) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None
        self.length = 0
        self.batch_size = batch_size

    @property
    def lengths(self) -> list[int]:
        return [self.length] * self.batch_size

    def write(self, layer: int, k_new: Tensor, v_new: Tensor) -> None:
        """k_new, v_new: [B, H_kv, T, D] appended after the current length."""
        self.keys = k_new if self.keys is None else torch.cat([self.keys[:, :, : self.length], k_new], dim=2)
        self.values = v_new if self.values is None else torch.cat([self.values[:, :, : self.length], v_new], dim=2)

    def view(self, layer: int, length: int) -> tuple[Tensor, Tensor]:
        return self.keys[:, :, :length], self.values[:, :, :length]

    def advance(self, n: int) -> None:
        self.length += n

    def check_room(self, n: int) -> None:
        """Always room: the tensors grow."""
