"""`augury profile`: the cost curve over every row count, its JSON for the planner, llama-bench beside it.

Tiny models throughout; timings are measured but never asserted (speed is for benchmarks), only that
every row count is there, positive, and read back exactly as written.
"""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import pytest
import torch

from augury.bench.forward import ForwardProfile, ProfileReport
from augury.bench.llama_cpp import llama_bench_ms, parse_llama_bench
from augury.calibration import RowPadding
from augury.cli import main
from augury.costs import costs_path, forward_curve, load_cost_curve, save_cost_curve
from augury.errors import AuguryError
from augury.models.loader import Model, load_model
from tests.test_peers_llamacpp import write_fake_llama_cpp
from tests.tiny import CharTokenizer, random_decoder

ROWS = [1, 2, 4, 5, 6, 8, 16, 32]


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("AUGURY_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _model(tmp_path: Path, exact: bool = True) -> Model:
    source = tmp_path / "tiny.gguf"
    if not source.exists():  # the curve is keyed by the file (path, size, mtime); its content is not read
        source.write_bytes(b"GGUF tiny")
    decoder = random_decoder(vocab=16, hidden=32)
    if not exact:
        decoder.padding = RowPadding()
    return Model("tiny", decoder, CharTokenizer(16), source)


def test_curve_has_every_row_count(tmp_path):
    curve = forward_curve(_model(tmp_path), context=8, rows=ROWS, repeats=1)
    assert list(curve) == ROWS and all(ms > 0 for ms in curve.values())


def test_the_curves_sizes_take_turns_so_a_slow_spell_moves_them_alike(tmp_path, monkeypatch):
    """Each timed round runs every size once, after one warm-up round: a slow spell of the machine then
    lands on every size, not on one size's whole run."""
    model = _model(tmp_path)
    seen: list[int] = []
    forward = model.decoder.forward

    def recording(tokens, cache, **kwargs):
        seen.append(tokens.shape[1])
        return forward(tokens, cache, **kwargs)

    monkeypatch.setattr(model.decoder, "forward", recording)
    forward_curve(model, context=8, rows=[1, 2, 4], repeats=3)
    assert seen == [8] + [1, 2, 4] * 4


def test_cost_curve_round_trips_for_the_same_model_machine_and_padding(tmp_path, home):
    model = _model(tmp_path)
    assert load_cost_curve(model) is None  # never measured
    curve = {r: 10.0 + r / 3 for r in ROWS}
    path = save_cost_curve(model, curve, context=512, weight_bytes=123, floor_ms=9.5)
    assert path == costs_path(model) and path.is_relative_to(home)
    assert load_cost_curve(model) == curve
    record = json.loads(path.read_text())
    assert record["context"] == 512 and record["floor_ms"] == 9.5
    assert record["padded_rows"] == {str(r): model.decoder.pad_rows(r) for r in ROWS}


def test_a_curve_from_another_padding_or_thread_count_is_not_used(tmp_path, home):
    model = _model(tmp_path)
    save_cost_curve(model, {r: float(r) for r in ROWS}, context=8, weight_bytes=1, floor_ms=1.0)
    unpadded = _model(tmp_path, exact=False)
    if any(unpadded.decoder.pad_rows(r) != model.decoder.pad_rows(r) for r in ROWS):
        assert load_cost_curve(unpadded) is None
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert load_cost_curve(model) is None  # measured under another thread count
    finally:
        torch.set_num_threads(threads)
    assert load_cost_curve(model) is not None


def test_an_unreadable_curve_is_none(tmp_path, home):
    model = _model(tmp_path)
    path = save_cost_curve(model, {1: 1.0}, context=8, weight_bytes=1, floor_ms=1.0)
    path.write_text("{not json")
    assert load_cost_curve(model) is None
    path.write_text(json.dumps({"version": 1, "key": "another machine", "rows_ms": {"1": 1.0}}))
    assert load_cost_curve(model) is None


def test_report_puts_formats_and_llama_cpp_side_by_side():
    bf16 = ForwardProfile("bf16", int(3e9), 512, {1: 90.0, 2: 99.0, 5: 72.0})
    gguf = ForwardProfile("gguf", int(1e9), 512, {1: 40.0, 2: 44.0, 5: 48.0})
    text = ProfileReport({"fp32 sum": 20.0, "1-row bf16 matmul": 40.0}, [bf16, gguf], {1: 33.0, 2: 30.0, 5: 50.0}).markdown()
    assert "bf16: weights read per step 3.00 GB; floor 75.0 ms" in text
    assert "gguf: weights read per step 1.00 GB; floor 25.0 ms" in text
    # rows, then each format's ms, x one token and x floor, then llama.cpp's ms and x one token
    assert "| 5 | 72.0 | 0.80 | 0.96 | 48.0 | 1.20 | 1.92 | 50.0 | 1.52 |" in text


def test_llama_bench_results_parse_from_a_fake_binary(tmp_path):
    llama = write_fake_llama_cpp(tmp_path / "bin")
    ms = llama_bench_ms(llama / "llama-bench", tmp_path / "t.gguf", ROWS, depth=512, threads=2)
    assert ms == pytest.approx({n: 30.0 + 2.0 * n for n in ROWS})  # the fake's avg_ns
    with pytest.raises(AuguryError, match="no prompt-processing results"):
        parse_llama_bench('{"n_prompt": 0, "n_gen": 32, "avg_ns": 1e9}\n')


def test_a_llama_bench_killed_by_a_signal_is_named_and_repack_off_reaches_it(tmp_path, monkeypatch):
    llama = write_fake_llama_cpp(tmp_path / "bin", crash_unless_repack_off="llama-bench")
    monkeypatch.delenv("LLAMA_ARG_REPACK", raising=False)
    with pytest.raises(AuguryError, match=r"^llama-bench was killed by SIGILL; .*LLAMA_ARG_REPACK=0"):
        llama_bench_ms(llama / "llama-bench", tmp_path / "t.gguf", ROWS, depth=512, threads=2)
    # the variable the other binaries read turns repacking off for llama-bench too
    monkeypatch.setenv("LLAMA_ARG_REPACK", "0")
    ms = llama_bench_ms(llama / "llama-bench", tmp_path / "t.gguf", ROWS, depth=512, threads=2)
    assert ms == pytest.approx({n: 30.0 + 2.0 * n for n in ROWS})


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    from tests.test_loading import write_llama_gguf
    from tests.tiny import hf_model

    return write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", hf_model("llama"))


def _profile(tiny_gguf, *extra) -> int:
    return main(["profile", "--model", str(tiny_gguf), "--dtype", "fp32", "--context", "8", "--decode-tokens", "3",
                 *extra])


def test_profile_command_prints_and_saves_the_curve_with_llama_bench_beside_it(
    tmp_path, home, tiny_gguf, capsys, monkeypatch
):
    import augury.bench.forward

    monkeypatch.setattr(augury.bench.forward, "read_bandwidth_gbs", lambda **_: {"fp32 sum": 10.0})  # not 1 GiB in a test
    llama = write_fake_llama_cpp(tmp_path / "bin")
    assert _profile(tiny_gguf, "--peers", "llamacpp", "--llama-cpp", str(llama)) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if re.match(r"\| \d+ \|", line)]
    assert [int(line.split("|")[1]) for line in table] == ROWS
    assert all(line.rstrip(" |").split(" | ")[-2] == f"{30.0 + 2.0 * r:.1f}" for line, r in zip(table, ROWS))
    model = load_model(str(tiny_gguf), dtype="fp32", progress=False)
    curve = load_cost_curve(model)
    assert curve is not None and sorted(curve) == ROWS and all(ms > 0 for ms in curve.values())


@pytest.mark.parametrize("argv, message", [
    (["--peers", "llamacpp"], "the llamacpp peers need --llama-cpp DIR"),
    (["--peers", "llamacpp", "--llama-cpp", "EMPTY"], "holds no executable llama-bench"),
    (["--peers", "vllm"], "unknown peer 'vllm'"),
])
def test_profile_bad_input_is_one_line(tmp_path, home, tiny_gguf, capsys, argv, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _profile(tiny_gguf, *[str(empty) if a == "EMPTY" else a for a in argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.skipif("weights" not in inspect.signature(load_model).parameters, reason="no native GGUF weights")
def test_profile_two_weight_formats_side_by_side(tmp_path, home, capsys, monkeypatch):
    import gguf

    import augury.bench.forward
    from tests.test_loading import write_llama_gguf
    from tests.tiny import hf_model

    monkeypatch.setattr(augury.bench.forward, "read_bandwidth_gbs", lambda **_: {"fp32 sum": 10.0})
    path = write_llama_gguf(tmp_path / "q8.gguf", hf_model("llama"), quant=gguf.GGMLQuantizationType.Q8_0)
    assert main(["profile", "--model", str(path), "--context", "8", "--decode-tokens", "3", "--rows", "1,2,5",
                 "--weights", "gguf,bf16"]) == 0
    out = capsys.readouterr().out
    assert "| new tokens after 8 | gguf ms | x one token | x floor | bf16 ms |" in out
    for fmt in ("gguf", "bf16"):
        model = load_model(str(path), weights=fmt, progress=False)
        assert sorted(load_cost_curve(model) or {}) == [1, 2, 5], fmt


def test_read_bandwidth_is_each_methods_median_and_reads_only():
    """The floor's bandwidth is a median of the repeats (one fast reading on a shared machine is not the
    sustained rate), and only methods that read are timed (a copy also writes)."""
    from augury.bench.forward import read_bandwidth_gbs

    spread: dict[str, tuple[float, float, float]] = {}
    got = read_bandwidth_gbs(size_bytes=1 << 24, repeats=5, spread=spread)
    assert "fp32 sum" in got and "copy" not in got, sorted(got)
    for method, gbs in got.items():
        lo, mid, hi = spread[method]
        assert gbs == mid and lo <= mid <= hi and gbs > 0, (method, gbs, spread[method])
