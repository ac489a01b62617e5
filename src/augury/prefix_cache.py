"""A prefix cache: the K/V rows of earlier sequences, reused by a new request that starts with the same tokens.

Why: each turn of a chat re-sends the whole history, and requests that share a
system prompt or few-shot examples share their first hundreds of tokens; on a
CPU, prefilling them again costs seconds per request.

The shape is vLLM's chained blocks, held as a tree: a sequence's rows are cut
into blocks of `block` tokens, and a block is found by its parent block and its
own tokens. The key is the token tuple itself, compared exactly, so two
sequences share a block only where every token before and in it is the same (no
hash can collide). A lookup walks whole blocks from the root, then takes the
longest common start of one child block: row i of a causal model depends on
tokens 0..i only, so the first j rows of a block serve any sequence that shares
its first j tokens. A sequence's rows past its last whole block are kept as a
tail, a leaf block of fewer tokens (a whole block with the same start replaces
it); the walk never descends into one, the partial match reads it.

Memory has a budget in bytes, reserved at once in one arena of whole blocks
(as vLLM reserves its block pool): the server's footprint is what it is at
start and does not grow as the cache fills, and a block's rows are copied into
a free slot rather than into a tensor of their own (no allocation per block).
The arena is shaped by the first cache it serves (`reserve`, called by whoever
builds the cache, or by the first `store`). A block with no free slot evicts
the least recently used leaf until one is free. A lookup or a store touches its
path from the deepest block up, so a parent is always used at least as recently
as each of its children and the oldest block is a leaf (eviction checks that
anyway).

Ownership: blocks a request stored carry its id until that request is settled
(`settle`): kept, they become shared; dropped (the client went away, the request
failed), the blocks it alone brought go at once, so a disconnect leaves nothing
behind. Another request that reads or extends a block makes it shared too.

Only the engine thread uses a cache; the counters are read by /metrics.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from augury.cache import KVCache
from augury.errors import AuguryError

DEFAULT_BLOCK = 16  # tokens per block: vLLM's default (a sequence's last partial block is kept as a tail)


def kv_bytes_per_token(cache: KVCache) -> int:
    """Bytes one token's keys and values take over every layer of a cache like `cache`."""
    keys = cache.keys[0]
    return 2 * len(cache.keys) * keys.shape[1] * keys.shape[3] * keys.element_size()


@dataclass(eq=False)
class _Block:
    tokens: tuple[int, ...]
    parent: _Block | None
    slot: int  # its rows' place in the arena; -1 at the root
    depth: int  # blocks from the root (the root is 0)
    owner: int | None = None  # the request that stored it, until settled or shared
    children: dict[tuple[int, ...], _Block] = field(default_factory=dict)


@dataclass(frozen=True)
class Match:
    """The cached start of a sequence: the blocks on its path (the last may serve only its first rows)."""

    blocks: tuple[_Block, ...]
    length: int  # tokens (rows) it covers


class PrefixCache:
    """K/V rows of earlier sequences by their tokens, under a byte budget with LRU eviction (see the module doc)."""

    def __init__(self, budget_bytes: int, block: int = DEFAULT_BLOCK) -> None:
        if budget_bytes < 0:
            raise ValueError(f"a prefix cache budget must be >= 0 bytes, got {budget_bytes}")
        if block < 1:
            raise ValueError(f"a prefix cache block must hold >= 1 token, got {block}")
        self.budget = budget_bytes
        self.block = block
        self._root = _Block((), None, -1, 0)
        self._lru: OrderedDict[int, _Block] = OrderedDict()  # id(block) -> block, least recently used first
        # The arena: [slots, layers, H_kv, block, D] keys and values, None until `reserve`.
        self._keys: Tensor | None = None
        self._values: Tensor | None = None
        self._free: list[int] = []  # arena slots no block holds
        self.block_bytes = 0  # one block's keys and values, once reserved
        self.bytes = 0  # held by cached blocks (the arena itself is `reserved`)
        self.hits = 0  # lookups through `take` that found rows
        self.misses = 0  # lookups through `take` that found none
        self.saved_tokens = 0  # rows served instead of prefilled
        self.evictions = 0  # blocks evicted for room (not those forgotten)

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def reserved(self) -> int:
        """Bytes the arena holds (0 before `reserve`)."""
        return 0 if self._keys is None else 2 * self._keys.numel() * self._keys.element_size()

    def reserve(self, layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device="cpu") -> None:
        """Allocate the budget's whole blocks for rows of this geometry, zeroed so the memory is taken now.

        Once: a second call (or a `store` after this one) must bring rows of
        the same shape, which `store` checks. A budget the device's free memory
        cannot hold is a one-line error here, at start, rather than the
        operating system's out-of-memory kill under load.
        """
        if self._keys is not None:
            return
        shape = (layers, kv_heads, self.block, head_dim)
        self.block_bytes = 2 * layers * kv_heads * self.block * head_dim * dtype.itemsize
        slots = self.budget // self.block_bytes
        free = free_memory(torch.device(device))
        if free is not None and slots * self.block_bytes > free:
            raise AuguryError(f"a prefix cache of {slots * self.block_bytes / 2**30:.2f} GB does not fit the "
                              f"{free / 2**30:.2f} GB of memory free on {device} (lower --prefix-cache-gb)")
        self._keys = torch.zeros((slots, *shape), dtype=dtype, device=device)
        self._values = torch.zeros((slots, *shape), dtype=dtype, device=device)
        self._free = list(range(slots - 1, -1, -1))  # popped from the end: slot 0 first

    def lookup(self, tokens: Sequence[int], limit: int) -> Match:
        """The longest cached start of `tokens`, at most `limit` tokens long."""
        node, n, path = self._root, 0, []
        while n + self.block <= limit:
            child = node.children.get(tuple(tokens[n : n + self.block]))
            if child is None:
                break
            path.append(child)
            node, n = child, n + self.block
        rest = tuple(tokens[n : min(limit, n + self.block)])
        best, best_len = None, 0
        for key, child in node.children.items():
            common = _common_start(key, rest)
            if common > best_len:
                best, best_len = child, common
        if best is not None:
            path.append(best)
        return Match(tuple(path), n + best_len)

    def take(self, tokens: Sequence[int], limit: int, cache: KVCache, row: int = 0) -> int:
        """Fill cache row `row` (slots 0..n-1) with the longest cached start of `tokens` (at most `limit`); returns n.

        Counts a hit or a miss. The row then holds exactly those n rows
        (length n); with n = 0 it is left as it was.
        """
        match = self.lookup(tokens, limit)
        if match.length == 0:
            self.misses += 1
            return 0
        slots = torch.tensor([b.slot for b in match.blocks], device=self._keys.device)
        cache.fill(row, _joined(self._keys, slots, match.length), _joined(self._values, slots, match.length))
        for block in match.blocks:
            block.owner = None  # read by another request: shared now
        self._touch(match.blocks[-1])
        self.hits += 1
        self.saved_tokens += match.length
        return match.length

    def store(self, tokens: Sequence[int], cache: KVCache, row: int = 0, owner: int | None = None) -> int:
        """Keep the rows of `tokens` from cache row `row` (slot j holds token j); returns blocks added.

        Blocks already cached are only touched; new ones are copied into free
        arena slots (the arena reserved here on the first store) and carry
        `owner` until `settle`. Stops at the first block the budget cannot hold.
        The rows past the last whole block are kept as a tail: a leaf of fewer
        tokens, which a lookup's partial match reads like the start of a block,
        and which a whole block holding the same rows replaces. So a chat's
        next turn reads every row of the turn before, not all but up to 15
        (a short turn's prefill is mostly those rows and its new question).
        """
        valid = min(len(tokens), cache.lengths[row])
        full = valid // self.block * self.block
        node, n = self._root, 0
        while n < full:
            child = node.children.get(tuple(tokens[n : n + self.block]))
            if child is None:
                break
            if child.owner != owner:
                child.owner = None  # another request brought it, or it is shared already
            node, n = child, n + self.block
        added = 0
        if n == full < valid and self._covered(node, tokens[full:valid]):
            valid = full  # a longer block there holds this tail's rows already
        if n < valid:
            keys, values = cache.copy_rows(row, n, valid)  # [layers, H_kv, valid - n, D] each
            layers, heads, _, dim = keys.shape
            self.reserve(layers, heads, dim, keys.dtype, keys.device)
            if self._keys.shape[1:] != (layers, heads, self.block, dim) or self._keys.dtype != keys.dtype:
                raise ValueError(f"rows of {layers} layers x {heads} x {dim} {keys.dtype} do not fit an arena of "
                                 f"{tuple(self._keys.shape[1:])} {self._keys.dtype}")
            for start in range(0, valid - n, self.block):
                if not self._make_room(node):
                    break
                piece = tuple(tokens[n + start : min(n + start + self.block, valid)])
                block = _Block(piece, node, self._free.pop(), node.depth + 1, owner)
                self._keys[block.slot, :, :, : len(piece)] = keys[:, :, start : start + len(piece)]
                self._values[block.slot, :, :, : len(piece)] = values[:, :, start : start + len(piece)]
                for key in [k for k in node.children if len(k) < len(piece) and piece[: len(k)] == k]:
                    self._remove(node.children[key])  # a tail this block holds the rows of
                node.children[block.tokens] = block
                self._lru[id(block)] = block
                self.bytes += self.block_bytes
                node, added = block, added + 1
        if node is not self._root:
            self._touch(node)
        return added

    @staticmethod
    def _covered(node: _Block, tail: Sequence[int]) -> bool:
        """Whether a child of `node` starts with `tail`'s tokens (so holds their rows)."""
        tail = tuple(tail)
        return any(key[: len(tail)] == tail for key in node.children)

    def settle(self, owner: int, keep: bool) -> None:
        """A request ended: keep its blocks as shared ones, or drop those that only it brought (deepest first)."""
        owned = sorted((b for b in self._lru.values() if b.owner == owner), key=lambda b: -b.depth)
        for block in owned:
            block.owner = None
            if not keep and not block.children:
                self._remove(block)

    def _touch(self, block: _Block) -> None:
        """Mark a path used, deepest block first, so that every parent is newer than its children."""
        while block is not self._root:
            self._lru.move_to_end(id(block))
            block = block.parent

    def _make_room(self, keep: _Block) -> bool:
        """Evict least recently used leaves (never `keep` or its ancestors) until an arena slot is free."""
        if self._keys is None or not len(self._keys):
            return False
        protected = set()
        node = keep
        while node is not None:
            protected.add(id(node))
            node = node.parent
        while not self._free:
            victim = next((b for b in self._lru.values() if not b.children and id(b) not in protected), None)
            if victim is None:
                return False
            self._remove(victim)
            self.evictions += 1
        return True

    def _remove(self, block: _Block) -> None:
        del block.parent.children[block.tokens]
        del self._lru[id(block)]
        self._free.append(block.slot)
        self.bytes -= self.block_bytes


def free_memory(device: torch.device) -> int | None:
    """Bytes a new allocation may take on `device` now: a GPU's free memory, or a CPU's available memory
    (/proc/meminfo's MemAvailable: free pages plus caches the kernel can drop); None where unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _common_start(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _joined(arena: Tensor, slots: Tensor, length: int) -> Tensor:
    """The rows of the blocks in arena slots `slots` (arena: [slots, layers, H_kv, block, D]), end to end and
    cut to `length` rows: [layers, H_kv, length, D]."""
    rows = arena[slots]  # [n, layers, H_kv, block, D]
    n, layers, heads, block, dim = rows.shape
    return rows.permute(1, 2, 0, 3, 4).reshape(layers, heads, n * block, dim)[:, :, :length]
