"""--max-step-ms: a step planned to take at most a given time, a bound on every stream's time per token.

Under load a step holds a row for every running stream, every drafted token
and every prompt piece, and on a CPU each row costs real time (a 16-row step
of the 1.5B is 4.8x a 1-row one on an AVX2 Zen 2, docs/benchmarks.md 25a). The
bound turns the target's measured cost against its rows into the rows a step
may hold: streams past them wait in the queue, drafts and prompt pieces are
cut to fit. The tests count rows, not wall time: the cost line is fixed, and
each forward's rows are recorded as it runs.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest
import torch

import augury.scheduler as scheduler_module
from augury.engine import Engine
from augury.errors import AuguryError
from augury.kernels import extension as ext_module
from augury.planner import Planner
from augury.step_bound import StepBound
from augury.sampling import SamplingParams
from augury.scheduler import Scheduler, SchedulerConfig
from augury.server.prometheus import render
from tests.native_tiny import VOCAB, native_model
from tests.proposer_cases import PROPOSER_CASES, make_proposer
from tests.test_chunked_prefill import Rows
from tests.tiny import run_scheduler

# A forward costs 8 ms + 2 ms a row: 14 ms hold 3 rows, 16 ms 4.
CURVE = {rows: 8.0 + 2.0 * rows for rows in (1, 2, 4, 8)}


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def bound(ms: float, costs=None, limit: int = 64) -> StepBound:
    """A bound of `ms` on CURVE's costs (or the given ones), the drafter batched."""
    costs = costs if costs is not None else Planner(4, batched=True, curve=CURVE).costs
    return StepBound(ms / 1000, costs, batched=True, limit=limit)


def watch_decoding(rows, scheduler: Scheduler) -> list[int]:
    """The streams decoding in each forward `rows` records from now on (the bound holds in those; a
    forward with nothing decoding feeds its prompts the whole budget)."""
    decoding: list[int] = []
    rows.during = lambda blocks: decoding.append(scheduler.running - scheduler.prefilling)
    return decoding


def decode_forwards(rows, decoding: list[int]) -> list[list[int]]:
    """The recorded forwards in which some stream decodes."""
    assert len(decoding) == len(rows.forwards), "a forward was not watched"
    return [f for f, d in zip(rows.forwards, decoding) if d]


def test_the_rows_within_a_time_follow_the_measured_costs():
    assert [bound(ms).rows() for ms in (14, 15.9, 16, 40)] == [3, 3, 4, 16]
    assert bound(1).rows() == 1, "a step too slow alone still runs one row"
    assert bound(1000, limit=10).rows() == 10 and bound(1000, limit=10).seats(6) == 6
    assert bound(1, Planner(4, batched=True).costs, limit=12).rows() == 12, "a bound before any cost was measured"
    b14 = bound(14)
    assert b14.rows() == 3 and b14.seats(16) == 3 and b14.pieces(8, 2) == 1 and b14.pieces(8, 3) == 1
    assert b14.pieces(40, 0) == 40, "with nothing decoding, the prompts' pieces were cut to a bounded step's rows"
    costs = b14.costs
    for _ in range(1000):  # steps of one size only: the discounted line forgets every other size
        costs.observe_rows(6, 0.020)
    assert costs.rows.line()[1] == 0.0, "the line kept a slope: the case below proves nothing"
    assert b14.rows() == 3, "a line through one size lifted the bound"
    for _ in range(3):  # 2 rows measured at 15 ms: the count stops below them (the line now runs 12.5 ms
        costs.observe_rows(2, 0.015)  # + 1.25 ms a row, through 2 rows' 15 and 6 rows' 20)
    assert b14.rows() == 1, "a size measured too slow was let in on the line's word"
    assert bound(15, costs).rows() == 2 and bound(16.25, costs).rows() == 3


def test_drafts_are_cut_longest_first_to_the_time_and_never_a_fixed_one():
    """CURVE's forward (8 ms + 2 ms a row) and drafting rounds of 3 ms: before drafting, a step of drafts
    3, 2, 1 is 8 + 2 * 9 + 3 * 3 = 35 ms; within 22 ms it keeps 0, 1, 1 (8 + 2 * 5 + 3 = 21; of equal
    lengths the first is cut). Once drafted, only the forward counts: 1, 2, 1 (8 + 2 * 7 = 22)."""
    b22 = bound(22)
    b22.costs.observe_draft(1, 10, 0.030)
    b22.costs.observe_draft(3, 10, 0.030)
    assert b22.fit([3, 2, 1], [False] * 3, 0, drafted=False) == [0, 1, 1]
    assert b22.fit([3, 2, 1], [False] * 3, 0, drafted=True) == [1, 2, 1]
    assert bound(100, b22.costs).fit([3, 2, 1], [False] * 3, 0, drafted=False) == [3, 2, 1]
    assert b22.fit([3, 2, 1], [False] * 3, 2, drafted=True) == [0, 1, 1], "prompt rows not counted"
    assert bound(10, b22.costs).fit([4, 4, 0], [False, True, False], 0, drafted=True) == [0, 4, 0], \
        "a seeded rejection draft was cut"


def test_the_rest_of_a_step_is_priced_beside_its_forward():
    """CURVE's forward (8 ms + 2 ms a row) and a measured rest of 1 ms a decoding sequence (verifying,
    sampling, the streams' text): 16.5 ms hold 2 rows, not 4 (8 + 2 * 2 + 2 = 14; 3 rows 17), and a
    step's drafts are cut by the same sum: 2 and 1 drafted tokens keep 0 and 1 (8 + 2 * 3 + 2 = 16),
    where the forward alone kept 1 and 1 (8 + 2 * 4 = 16)."""
    b = bound(16.5)
    assert b.rows() == 4 and b.fit([2, 1], [False, False], 0, drafted=True) == [1, 1]
    for sequences in (1, 2, 4, 8):
        for _ in range(3):
            b.costs.observe_rest(sequences, sequences / 1000)
    assert b.rows() == 2 and b.seats(16) == 2, "the rest of a step was not priced"
    assert bound(17.5, b.costs).rows() == 3
    assert b.fit([2, 1], [False, False], 0, drafted=True) == [0, 1]


def test_a_bad_bound_is_one_line(capsys):
    target = native_model("qwen2", seed=5)
    for bad in (0.0, -5.0, float("nan"), float("inf")):
        with pytest.raises(AuguryError, match="max step time"):
            Scheduler(target, None, SchedulerConfig(max_step_ms=bad))
    from augury.cli import main

    for value in ("0", "-1", "nan"):
        assert main(["serve", "--model", "nothing-here", "--max-step-ms", value]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--max-step-ms" in err[0], err


def test_without_a_saved_curve_the_bound_measures_the_forward_at_start(monkeypatch):
    monkeypatch.setattr(scheduler_module, "_cost_curve", lambda target: None)
    target = native_model("qwen2", seed=5)
    assert not Scheduler(target, None, SchedulerConfig()).planner.costs.rows.recent, "measured without a bound"
    scheduler = Scheduler(target, None, SchedulerConfig(max_step_ms=50.0))
    assert sorted(scheduler.planner.costs.rows.recent) == [1, 2, 4, 8]


@pytest.fixture
def bounded(monkeypatch):
    """A scheduler factory whose step costs are CURVE's line for the whole run (the tiny model's own steps,
    microseconds, would otherwise move it), on a target whose forwards' rows are recorded."""
    if ext_module.extension() is None:
        pytest.skip("the GGUF kernel extension cannot be built here: no native layer, no ragged rows")
    import augury.costs

    monkeypatch.setattr(augury.costs, "prefill_rates", lambda model: (100.0, 100.0))  # prompts in pieces
    monkeypatch.setattr(scheduler_module, "_cost_curve", lambda target: CURVE)
    model = native_model("qwen2", seed=5)
    rows = model.decoder = Rows(model.decoder)

    def make(proposer=None, **config) -> Scheduler:
        scheduler = Scheduler(model, proposer, SchedulerConfig(**config))
        scheduler.planner.costs.rows.observe = lambda *args: None
        scheduler.planner.costs.rest.observe = lambda *args: None
        return scheduler

    return model, rows, make


def test_each_decode_step_reports_what_it_took_beyond_its_forward(bounded):
    """The scheduler measures the rest of every step in which streams decode, by how many: three requests
    on three rows, prompts of 3-5 tokens, 6 tokens each, so steps decode 1 to 3 sequences; each rest is
    under the wall time of the whole run and not negative."""
    model, rows, make = bounded
    scheduler = make(max_batch=3, max_step_ms=50.0)
    samples: list[tuple[int, float]] = []
    scheduler.planner.costs.observe_rest = lambda sequences, seconds: samples.append((sequences, seconds))
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    t0 = time.perf_counter()
    run_scheduler(scheduler, [(tokens(n, seed=n), params) for n in (3, 4, 5)])
    wall = time.perf_counter() - t0
    assert samples, "no step's rest was measured"
    assert {n for n, _ in samples} <= {1, 2, 3} and 3 in {n for n, _ in samples}, f"sequences per step: {samples}"
    assert all(0.0 <= seconds < wall for _, seconds in samples), f"rests {samples} in a run of {wall:.3f} s"


@pytest.mark.parametrize("bound", [None, 14.0])
def test_under_the_bound_no_step_holds_more_rows_than_fit_and_the_text_is_the_same(bound, bounded):
    """Six requests on six rows, prompts from 2 to 90 tokens (past the 64-token row-attention limit, so
    they enter in pieces). Bounded at 14 ms, at most 3 sequences a forward and at most 3 rows in every
    forward that a stream decodes in (streams, pieces, both), while a forward with nothing decoding feeds
    its prompts the whole budget; each request's text is what it gets alone. Unbounded, forwards hold all
    six (the check can fail)."""
    model, rows, make = bounded
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    prompts = [tokens(n, seed=n) for n in (2, 9, 30, 64, 5, 90)]
    alone = [run_scheduler(make(max_batch=1), [(p, params)])[0].token_ids for p in prompts]
    rows.forwards.clear()
    scheduler = make(max_batch=6, max_step_ms=bound)
    decoding = watch_decoding(rows, scheduler)
    got = [r.token_ids for r in run_scheduler(scheduler, [(p, params) for p in prompts])]
    assert got == alone, "a bounded step changed a request's text"
    widest = max(sum(f) for f in decode_forwards(rows, decoding))
    most = max(len(f) for f in rows.forwards)
    if bound is None:
        assert most == 6 and widest > 3, f"unbounded, the forwards held at most {most} sequences, {widest} rows"
    else:
        assert scheduler.seats == 3
        assert "augury_seats 3" in render(scheduler, Counter()).splitlines(), "/metrics does not show the bound"
        assert widest <= 3 and most <= 3, f"a forward held {most} sequences and {widest} rows, over 3"
        prompt_only = [sum(f) for f, d in zip(rows.forwards, decoding) if not d]
        assert prompt_only and max(prompt_only) > 3, f"with nothing decoding, prompts were fed {prompt_only} rows"


@pytest.mark.parametrize("case", [c for c in PROPOSER_CASES if c.name in ("suffix", "model")], ids=lambda c: c.name)
def test_drafts_are_cut_to_the_rows_left_and_still_drafted(case, bounded):
    """Two greedy streams that repeat themselves (drafts are accepted), K 4 every step, bounded at 16 ms (4 rows): no
    forward holds more than 4 rows, drafts still ride in them, and the text is the plain engine's."""
    model, rows, make = bounded
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    prompts = [(tokens(5, seed=s) * 4)[:12] for s in (1, 2)]
    want = [Engine(model).generate(p, params).token_ids for p in prompts]
    rows.forwards.clear()
    scheduler = make(make_proposer(case, model), max_batch=2, k=4, adaptive_k=False, max_step_ms=16.0)
    decoding = watch_decoding(rows, scheduler)
    got = [r.token_ids for r in run_scheduler(scheduler, [(p, params) for p in prompts])]
    assert got == want, f"{case.name}: text differs from the plain engine's"
    assert scheduler.stats.drafted > 0, f"{case.name} never drafted: the check proved nothing"
    decode = [f for f in rows.forwards if len(f) == 2 and max(f) <= 5]
    assert any(sum(f) > 2 for f in decode), "no forward verified a draft"
    widest = max(sum(f) for f in decode_forwards(rows, decoding))
    assert widest <= 4, f"a forward with streams decoding held {widest} rows"


def test_other_threads_read_the_engine_threads_last_count_of_seats(bounded):
    """/metrics and `submit` run on the server's threads while the engine thread's steps change the costs
    (a median read while a step appends to its samples can raise): they read the last count, never the costs."""
    model, rows, make = bounded
    scheduler = make(max_batch=6, max_step_ms=14.0)

    def busy(max_batch: int) -> int:
        raise RuntimeError("deque mutated during iteration")

    scheduler.bound.seats = busy
    assert scheduler.seats == 3
    assert "augury_seats 3" in render(scheduler, Counter()).splitlines()
