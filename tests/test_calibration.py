"""The measured row padding (`calibration.calibrate`): found from the kernels' own bits, cached per machine.

Synthetic matmuls stand in for the kernels, with the row-count quirks real
ones have (a GEMV path below 4 rows, oneDNN's packed bf16 on an AMX CPU);
the decoder's bitwise block-vs-steps tests use the padding on real shapes.
"""

from __future__ import annotations

import json

import torch

from augury.calibration import RowPadding, calibrate, load_or_calibrate


def test_calibration_finds_the_padding_that_avoids_a_row_dependent_kernel(monkeypatch):
    """A matmul that rounds differently below 4 rows (as a GEMV path does) is invariant only when
    padded to at least 4 (or split into pieces of at most 3 rows, which costs a call each); the
    calibration must find that, not assume it. A matmul's time is a call plus its rows (timed for real
    under the suite's other worker, 2 rows once looked faster than 1 and padded every token)."""
    import augury.calibration as calibration

    monkeypatch.setattr(calibration, "_seconds", lambda agree, n, repeats=3: 5e-3 + n * 1e-4)
    weight = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))

    def rowwise(x):  # every row through the same one-row product: invariant by construction
        return torch.stack([weight @ row for row in x])

    def quirky(x):
        out = rowwise(x)
        return out if x.shape[0] >= 4 else out + 1e-3  # another kernel, other bits

    padding = calibrate([quirky], [8], torch.float32, max_rows=12)
    assert padding.checked_rows == 12
    assert padding.pad(1) >= 4 and all(padding.pad(r) >= 4 for r in range(1, 13))
    plain = calibrate([rowwise], [8], torch.float32, max_rows=12)
    assert plain.pad(1) == 1, "an invariant matmul needs no padding"


def test_timing_noise_between_bases_keeps_the_smaller_padding(monkeypatch):
    """Every base agrees for an invariant matmul; when 2 rows time 1% faster than 1 (noise) the
    unpadded table must still win, and when 2 rows are really faster (half the time) padding wins."""
    import augury.calibration as calibration

    weight = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))

    def rowwise(x):
        return torch.stack([weight @ row for row in x])

    for two_rows, expected in ((0.99, 1), (0.5, 2)):
        times = lambda agree, n, repeats=3: (two_rows if n == 2 else n) * 1e-3  # noqa: E731
        monkeypatch.setattr(calibration, "_seconds", times)
        padding = calibrate([rowwise], [8], torch.float32, max_rows=12)
        assert padding.pad(1) == expected, (two_rows, padding)
        assert all(padding.pad(r) == r for r in range(3, 13)), padding


def test_calibration_pads_only_the_row_counts_a_kernel_rounds_differently(monkeypatch):
    """Like oneDNN's packed bf16 weights on an AMX CPU: rows agree for 2-11 rows and for multiples
    of 32, not alone and not for 12-31. The table must keep 2-11 as they are (no padding to 32 for
    a 5-row verification), send 1 to 2 and 12-32 to 32, and split longer matmuls into pieces the
    table covers, since no row multiple agrees with 2-11 past the table. A matmul's time is taken as
    proportional to its rows: timed for real, these microsecond matmuls on a loaded machine (the suite's
    other worker) once made a table that pads 2 rows to 12 look as fast and the choice flipped."""
    import augury.calibration as calibration

    monkeypatch.setattr(calibration, "_seconds", lambda agree, n, repeats=3: n * 1e-3)
    weight = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))

    def amx_like(x):
        out = torch.stack([weight @ row for row in x])
        n = x.shape[0]
        return out if 2 <= n <= 11 or n % 32 == 0 else out + 1e-3

    padding = calibrate([amx_like], [8], torch.float32, max_rows=40)
    assert [padding.pad(r) for r in range(1, 12)] == [2] + list(range(2, 12)), padding
    assert all(padding.pad(r) == 32 for r in range(12, 33)), padding
    assert padding.checked_rows == 32 and padding.multiple == 0
    assert padding.pieces(33) == [(32, 32), (1, 2)] and padding.pieces(100) == [(32, 32)] * 3 + [(4, 4)]
    for r in range(1, 101):  # every piece really gives each row its bits alone
        x = torch.randn(r, 8)
        alone = torch.cat([amx_like(row.expand(padding.pad(1), -1))[:1] for row in x])
        out, start = [], 0
        for real, padded in padding.pieces(r):
            piece = x[start : start + real]
            out.append(amx_like(torch.cat([piece, piece[-1:].expand(padded - real, -1)]))[:real])
            start += real
        assert start == r and torch.equal(torch.cat(out), alone), r


def test_a_padding_cached_in_another_format_is_measured_again(tmp_path):
    path = tmp_path / "padding.json"
    path.write_text(json.dumps({"key": "machine-a", "padding": {"multiple": 32, "minimum": 32, "checked_rows": 48}}))
    measured = RowPadding((1, 2, 3), 4, 3)
    assert load_or_calibrate(path, "machine-a", lambda: measured) == measured
    assert load_or_calibrate(path, "machine-a", lambda: RowPadding()) == measured, "the new file is kept"


def test_calibration_is_cached_with_the_model_and_measured_again_on_another_machine(tmp_path):
    path = tmp_path / "padding.json"
    calls = []

    def measure():
        calls.append(1)
        return RowPadding((16, 16, 17), 2, 3)

    assert load_or_calibrate(path, "machine-a", measure) == RowPadding((16, 16, 17), 2, 3)
    assert load_or_calibrate(path, "machine-a", measure) == RowPadding((16, 16, 17), 2, 3)
    assert len(calls) == 1
    load_or_calibrate(path, "machine-b", measure)
    assert len(calls) == 2


def test_a_forced_kernel_path_keys_its_files_however_it_is_spelt(monkeypatch):
    """AUGURY_ISA=AVX2, ' avx2 ' and avx2 force one kernel path, so they share one key (each spelling
    re-measured the costs and left a file of its own); a forced path is keyed apart from no forcing."""
    from augury.calibration import machine_key

    keys = {}
    for value in ("avx2", "AVX2", " avx2 ", "portable", ""):
        monkeypatch.setenv("AUGURY_ISA", value)
        keys[value] = machine_key(torch.float32, ["GgufWeight"])
    assert keys["avx2"] == keys["AVX2"] == keys[" avx2 "]
    assert len({keys["avx2"], keys["portable"], keys[""]}) == 3
