"""Machine facts measured, not assumed: the row padding that makes matmuls batch invariant.

Bitwise-equal greedy output rests on one property: a token's logits must be
the same bits whether its row went through the matmuls alone (plain decoding)
or inside a block of drafted tokens or a server batch. CPU matmul libraries
pick kernels by the number of rows, and rows in different kernels round
differently. Which row counts agree differs by CPU, by library version, by
thread count and by weight format: on one CPU fp32 rows were invariant from 4
rows on, on another (with AMX) only from 16; bf16 `F.linear` breaks past 32
rows; oneDNN's packed bf16 weights on one AMX CPU agreed for 1-11 and 24-54
rows and for no row count from 55 to 256 but 96 (docs/design.md).

So the padding is measured, as a table: for a `base` (the rows one token
alone is padded to), every row count n from 1 to `max_rows` is multiplied
once with the model's own weight shapes, and the calibration records how
many leading rows of it equal the same rows computed alone at `base` rows.
A block of r real rows is then padded to the fastest count whose first r
rows agree (timed on the same weights), so a block pays for padding only
where the machine needs it: 5 rows stay 5 rows where 5 agrees, and 12 go
to 24 only where 12-23 do not. Past the table, counts are rounded up to the
smallest row multiple that agrees at the probes, or, where none does, split
into pieces the table covers. Of the bases, the fastest over 1-8 rows and
batches of 16, 32 and 64 is kept. The loader caches the result next to the
converted model, keyed by what it depends on (`machine_key`).
"""

from __future__ import annotations

import hashlib
import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from augury.files import write_json_atomic
from augury.kernels.extension import forced_isa

# The rows one token alone may be padded to (its "alone" reference), cheapest first: the order breaks ties.
BASES = (1, 2, 4, 8, 16, 32)
# Past the table a row count is rounded up to a multiple of one of these (the smallest whose probes agree).
MULTIPLES = (1, 2, 4, 8, 16, 32, 64)
# Rows the table covers, each checked: a server batch flattens sequences x block rows into one matmul.
MAX_ROWS = 64
# Past the table, the row multiple is checked at these multiples of max_rows (a server batch of 16 x 9 rows is 144).
PROBE_FACTORS = (1.25, 1.5, 2.0, 3.0, 4.0)
# Distinct activation rows: longer blocks repeat them, so each row's alone result is computed once per base.
DISTINCT = 16
# Row counts whose padded matmuls decide between bases: decode and verification blocks, and server batches.
SCORED_ROWS = (*range(1, 9), 16, 32, 64)
# Blocks up to this many rows take the fastest good count up to 2r + 8 (padding up can be faster: a
# kernel for 4 rows may beat the one for 2); longer ones take the smallest good count.
SPEED_ROWS = 16
# Counts within this fraction of the fastest, plus NOISE_S, count as equally fast (the smaller wins):
# timing noise. NOISE_S keeps a tiny model's microsecond matmuls from padding by chance.
SAME_SPEED = 0.05
NOISE_S = 50e-6
FORMAT = 2  # of the cached file: a file of another format is measured again


@dataclass(frozen=True)
class RowPadding:
    """How a matmul of `rows` real rows is run so that each row gets the bits it gets alone.

    table[r - 1] is the padded count for r rows (r <= len(table)). Past the
    table, counts are rounded up to `multiple`; multiple 0 means no multiple
    agreed there, and longer matmuls are split into pieces of `checked_rows`
    (each piece a count the table covers: a server batch costs more weight
    reads than one matmul, but its rows keep their bits). Invariant for
    1..checked_rows real rows, and past that where the rule held at the
    probes. The default pads nothing.
    """

    table: tuple[int, ...] = ()
    multiple: int = 1
    checked_rows: int = 0  # 0: not measured (no padding, or a device that gives no such guarantee)

    def pieces(self, rows: int) -> list[tuple[int, int]]:
        """(real rows, padded rows) of each matmul that `rows` real rows are run as, in order."""
        if rows <= len(self.table):
            return [(rows, self.table[rows - 1])]
        if self.multiple:
            return [(rows, -(-rows // self.multiple) * self.multiple)]
        whole, rest = divmod(rows, self.checked_rows)
        out = [(self.checked_rows, self.table[self.checked_rows - 1])] * whole
        return out + ([(rest, self.table[rest - 1])] if rest else [])

    def pad(self, rows: int) -> int:
        """How many rows the matmuls over `rows` real rows multiply in all."""
        return sum(padded for _, padded in self.pieces(rows))

    def to_dict(self) -> dict:
        return {"table": list(self.table), "multiple": self.multiple, "checked_rows": self.checked_rows}

    @classmethod
    def from_dict(cls, data: dict) -> "RowPadding":
        return cls(tuple(int(n) for n in data["table"]), int(data["multiple"]), int(data["checked_rows"]))


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
    isa = forced_isa() or ""  # a forced kernel path costs and rounds as its own machine (however it is spelt)
    parts = [cpu, isa, torch.__version__, str(torch.get_num_threads()), str(dtype), *sorted(set(weight_kinds))]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


class _Agreement:
    """How many leading rows of an n-row matmul get the bits they get alone, per base, over the given matmuls.

    linears: callables x [R, in] -> [R, out] (the model's own weights). A
    block of n rows repeats `DISTINCT` random rows, so row i must equal the
    alone result of row i % DISTINCT: that checks every position of the
    block (kernels split rows into tiles and treat a tail tile differently)
    with one alone computation per distinct row and base. Only leading rows
    count: padding rows follow the real ones, so an n-row kernel that rounds
    its last tile differently still serves blocks that end before it. Each
    count is multiplied once and compared with every base.
    """

    def __init__(self, linears: list, in_features: list[int], dtype: torch.dtype) -> None:
        gen = torch.Generator().manual_seed(0)
        self.linears = linears
        self.xs = [torch.randn(DISTINCT, n, generator=gen).to(dtype) for n in in_features]
        self.alone = {
            base: [
                torch.stack([f(x[i : i + 1].expand(base, -1))[0] for i in range(DISTINCT)])
                for f, x in zip(linears, self.xs)
            ]
            for base in BASES
        }
        self._agreeing: dict[int, dict[int, int]] = {}

    def block(self, n: int) -> list[Tensor]:
        """Per matmul, the [n, in] block of repeated distinct rows."""
        index = torch.arange(n) % DISTINCT
        return [x[index] for x in self.xs]

    def agreeing(self, n: int, base: int) -> int:
        """How many leading rows of an n-row matmul equal their rows alone at `base` rows (0 if n < base)."""
        if n not in self._agreeing:
            index = torch.arange(n) % DISTINCT
            outs = [f(x) for f, x in zip(self.linears, self.block(n))]
            self._agreeing[n] = {}
            for b in BASES:
                same = torch.ones(n, dtype=torch.bool)
                for out, alone in zip(outs, self.alone[b]):
                    same &= (out == alone[index]).all(dim=1)
                self._agreeing[n][b] = n if bool(same.all()) else int(torch.nonzero(~same)[0])
        return self._agreeing[n][base] if n >= base else 0


def _seconds(agree: _Agreement, n: int, repeats: int = 3) -> float:
    """Best-of-repeats seconds of one n-row matmul through every given weight."""
    blocks = agree.block(n)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for f, x in zip(agree.linears, blocks):
            f(x)
        best = min(best, time.perf_counter() - t0)
    return best


def _padding_for(agree: _Agreement, base: int, max_rows: int, seconds) -> RowPadding | None:
    """The fastest invariant table for one base, or None if a token alone at `base` rows is not its own reference."""
    if agree.agreeing(base, base) < 1:
        return None
    counts = range(base, max_rows + 1)
    table: list[int] = []
    for r in range(1, max_rows + 1):
        fits = [n for n in counts if n >= r and agree.agreeing(n, base) >= r]
        if not fits:
            break
        if r <= SPEED_ROWS:
            near = [n for n in fits if n <= 2 * r + 8] or fits[:1]
            fastest = min(seconds(n) for n in near)
            table.append(next(n for n in near if seconds(n) <= fastest * (1 + SAME_SPEED) + NOISE_S))
        else:
            table.append(fits[0])
    checked = len(table)
    if not checked:  # base > max_rows
        return None
    multiple = 0  # a gap in the table: past it, only pieces the table covers are safe
    if checked == max_rows:
        probes = [int(max_rows * f) for f in PROBE_FACTORS]
        multiple = next((m for m in MULTIPLES if all(agree.agreeing(-(-p // m) * m, base) >= p for p in probes)), 0)
    return RowPadding(tuple(table), multiple, checked)


@torch.inference_mode()
def calibrate(linears: list, in_features: list[int], dtype: torch.dtype, max_rows: int = MAX_ROWS) -> RowPadding:
    """Measure the fastest row padding under which every given matmul is batch invariant.

    linears: callables x [R, in] -> [R, out] (the model's own weights);
    in_features: each one's input width. Every row count of 1..max_rows is
    checked; checked_rows says how many rows one matmul may hold (more are
    split into pieces, unless a row multiple agreed at the probes past it).
    """
    agree = _Agreement(linears, in_features, dtype)
    timed: dict[int, float] = {}

    def seconds(n: int) -> float:
        if n not in timed:
            timed[n] = _seconds(agree, n)
        return timed[n]

    paddings = [p for p in (_padding_for(agree, base, max_rows, seconds) for base in BASES) if p is not None]
    score = {id(p): sum(seconds(n) for r in SCORED_ROWS for _, n in p.pieces(r)) for p in paddings}
    fastest = min(score.values())
    # the smallest base within timing noise of the fastest: padding costs rows, so noise must not choose it
    return next(p for p in paddings if score[id(p)] <= fastest * (1 + SAME_SPEED) + NOISE_S)


def load_or_calibrate(path: Path | None, key: str, measure) -> RowPadding:
    """The padding cached at `path` for this machine key, else `measure()` (written there if a path is given)."""
    if path is not None and path.exists():
        try:
            data = json.loads(path.read_text())
            if data.get("key") == key and data.get("format") == FORMAT:
                return RowPadding.from_dict(data["padding"])
        except (OSError, ValueError, KeyError, TypeError):
            pass  # an unreadable cache is measured again
    padding = measure()
    if path is not None:
        try:
            write_json_atomic(path, {"key": key, "format": FORMAT, "padding": padding.to_dict()})
        except OSError:
            pass  # a read-only cache only costs a calibration next time
    return padding
