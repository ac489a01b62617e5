"""Machine facts measured, not assumed: the row padding that makes matmuls batch invariant.

Bitwise-equal greedy output rests on one property: a token's logits must be
the same bits whether its row went through the matmuls alone (plain decoding)
or inside a block of drafted tokens or a server batch. CPU matmul libraries
pick kernels by the number of rows, and rows in different kernels round
differently. Which row counts are safe differs by CPU, by library version, by
thread count and by weight format: on one CPU fp32 rows were invariant from 4
rows on, on another (with AMX) only from 16; bf16 `F.linear` breaks past 32
rows while oneDNN's packed weights hold to hundreds (docs/design.md).

So the padding is measured: for each candidate (multiple, minimum) every row
count from 1 to `max_rows` is padded, multiplied with the model's own weight
shapes, and each row compared with the same row computed alone. Of the
candidates that are invariant, the one whose padded steps of 1-8 rows run
fastest is kept. The loader caches the result next to the converted model,
keyed by what it depends on (`machine_key`).
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import Tensor

# (row multiple, minimum rows), cheapest first: the order breaks timing ties.
CANDIDATES: tuple[tuple[int, int], ...] = (
    (1, 1), (1, 2), (2, 2), (1, 4), (4, 4), (1, 8), (8, 8), (1, 16), (16, 16), (1, 32), (32, 32),
)
# Rows checked: a server batch flattens sequences x block rows into one matmul.
MAX_ROWS = 48
# Row counts whose padded matmuls are timed to pick the fastest invariant candidate (decode and verify).
TIMED_ROWS = tuple(range(1, 9))


@dataclass(frozen=True)
class RowPadding:
    """Pad a forward of `rows` real rows up to `pad(rows)`; invariant for 1..checked_rows real rows."""

    multiple: int = 1
    minimum: int = 1
    checked_rows: int = 0  # 0: not measured (no padding, or a device that gives no such guarantee)

    def pad(self, rows: int) -> int:
        padded = max(rows, self.minimum)
        return -(-padded // self.multiple) * self.multiple

    def to_dict(self) -> dict:
        return asdict(self)


NO_PADDING = RowPadding()


def machine_key(dtype: torch.dtype, weight_kinds: list[str]) -> str:
    """What batch invariance depends on: CPU, torch build, threads, dtype and weight formats."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                cpu += "|" + line.split(":", 1)[1].strip()
                if line.startswith("flags"):
                    break
    except OSError:
        pass
    parts = [cpu, torch.__version__, str(torch.get_num_threads()), str(dtype), *sorted(set(weight_kinds))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _padded(rows: int, padding: tuple[int, int]) -> int:
    multiple, minimum = padding
    return -(-max(rows, minimum) // multiple) * multiple


class _Rows:
    """One weight's padded matmul results over prefixes of x [max_rows, in], each computed once.

    Candidates share most of their (rows, padded rows) shapes, so the check
    over all of them costs little more than over one.
    """

    def __init__(self, linear, x: Tensor) -> None:
        self.linear = linear
        self.x = x
        self.done: dict[tuple[int, int, int], Tensor] = {}

    def block(self, start: int, rows: int, padded: int) -> Tensor:
        """Rows x[start:start + rows] padded with copies of the last to `padded` rows: the real rows' results."""
        key = (start, rows, padded)
        if key not in self.done:
            x = self.x[start : start + rows]
            if padded > rows:
                x = torch.cat([x, x[-1:].expand(padded - rows, -1)])
            self.done[key] = self.linear(x)[:rows]
        return self.done[key]

    def invariant_up_to(self, padding: tuple[int, int]) -> int:
        """The largest R such that every row of every padded block of 1..R rows equals that row alone."""
        alone = [self.block(i, 1, _padded(1, padding))[0] for i in range(self.x.shape[0])]
        for r in range(2, self.x.shape[0] + 1):
            out = self.block(0, r, _padded(r, padding))
            if any(not torch.equal(out[i], alone[i]) for i in range(r)):
                return r - 1
        return self.x.shape[0]


def _timed(rows: list[_Rows], padding: tuple[int, int], repeats: int = 3) -> float:
    """Best-of-repeats seconds of padded matmuls over TIMED_ROWS rows, summed over the weights."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for r in rows:
            for n in TIMED_ROWS:
                r.linear(r.x[: _padded(n, padding)])
        best = min(best, time.perf_counter() - t0)
    return best


def _dominated(c: tuple[int, int], others: list[tuple[int, int]], max_rows: int) -> bool:
    """Whether another candidate pads every row count at most as much as c, and one strictly less."""
    mine = [_padded(r, c) for r in range(1, max_rows + 1)]
    for o in others:
        theirs = [_padded(r, o) for r in range(1, max_rows + 1)]
        if o != c and all(t <= m for t, m in zip(theirs, mine)) and theirs != mine:
            return True
    return False


@torch.inference_mode()
def calibrate(linears: list, in_features: list[int], dtype: torch.dtype, max_rows: int = MAX_ROWS) -> RowPadding:
    """Measure the fastest padding under which every given matmul is batch invariant for 1..max_rows rows.

    linears: callables x [R, in] -> [R, out] (the model's own weights);
    in_features: each one's input width. If no candidate is invariant up to
    max_rows, the one invariant the furthest is returned, with checked_rows
    saying how far (the caller warns).
    """
    gen = torch.Generator().manual_seed(0)
    rows = [_Rows(f, torch.randn(max_rows, n, generator=gen).to(dtype)) for f, n in zip(linears, in_features)]
    reach = {c: min(r.invariant_up_to(c) for r in rows) for c in CANDIDATES}
    best_reach = max(reach.values())
    eligible = [c for c in CANDIDATES if reach[c] == best_reach]
    eligible = [c for c in eligible if not _dominated(c, eligible, max_rows)]
    if len(eligible) > 1:
        eligible.sort(key=lambda c: _timed(rows, c))
    multiple, minimum = eligible[0]
    return RowPadding(multiple, minimum, best_reach)


def load_or_calibrate(path: Path | None, key: str, measure) -> RowPadding:
    """The padding cached at `path` for this machine key, else `measure()` (written there if a path is given)."""
    if path is not None and path.exists():
        try:
            data = json.loads(path.read_text())
            if data.get("key") == key:
                return RowPadding(**data["padding"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # an unreadable cache is measured again
    padding = measure()
    if path is not None:
        try:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"key": key, "padding": padding.to_dict()}, indent=1))
            tmp.replace(path)
        except OSError:
            pass  # a read-only cache only costs a calibration next time
    return padding
