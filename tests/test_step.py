"""The one step and its hooks: both drivers share it, proposers hear every step and get the target's states."""

from __future__ import annotations

import pytest
import torch

from augury.cache import DRAFT_MARGIN, SLACK, KVCache, draft_room, slots_for
from augury.engine import Engine
from augury.errors import AuguryError
from augury.proposers import build_proposer
from augury.proposers.base import Draft, ProposerBase
from augury.sampling import SamplingParams
from augury.scheduler import Scheduler, SchedulerConfig
from augury.step import MAX_K
from tests.proposer_cases import PROPOSER_CASES, make_proposer
from tests.tiny import run_scheduler, tiny_model

VOCAB = 24


class Listening(ProposerBase):
    """Drafts a fixed guess (often rejected) and records everything the hooks hand it."""

    name = "listening"
    needs_hidden = True
    needs_every_step = True

    def __init__(self, draft_every: int = 2, hidden_layers: tuple[int, ...] = ()) -> None:
        self.hidden_layers = hidden_layers
        self.draft_every = draft_every
        self.hidden: dict[int, list[torch.Tensor]] = {}
        self.steps: dict[int, list[tuple[int, int]]] = {}  # (drafted, accepted) per step heard
        self.proposed: dict[int, int] = {}

    def start(self, seq, prompt_hidden=None) -> None:
        assert prompt_hidden is not None and prompt_hidden.shape[0] == len(seq.tokens) - 1
        self.hidden[seq.id] = [prompt_hidden]
        self.steps[seq.id] = []
        self.proposed[seq.id] = 0

    def propose(self, seq, k: int) -> Draft:
        self.proposed[seq.id] += 1
        if self.proposed[seq.id] % self.draft_every:
            return Draft([])  # a step that drafts nothing: the hook must still run
        last = seq.tokens[-1]
        return Draft([(last + i) % VOCAB for i in range(1, k + 1)])

    def on_step(self, seq, result, hidden) -> None:
        self.steps[seq.id].append((result.num_drafted, result.num_accepted))
        self.hidden[seq.id].append(hidden)


@pytest.fixture(scope="module")
def target():
    return tiny_model(vocab=VOCAB, seed=3, hidden=32, layers=3)


def _fresh_hidden(target, tokens: list[int], layers: tuple[int, ...] = ()) -> torch.Tensor:
    cache = target.decoder.new_cache(1, len(tokens) + 8)
    _, hidden = target.decoder.forward(torch.tensor([tokens]), cache, return_hidden=True, hidden_layers=layers)
    return hidden[0]


@pytest.mark.parametrize("layers", [(), (0, 2)])
def test_engine_hands_the_proposer_exactly_a_fresh_prefills_hidden_states(target, layers):
    """fp32, short enough that the fresh prefill attends row by row too: the states handed over
    step by step (the prompt's from the prefill, then each step's newly cached positions) are
    bitwise those of one prefill of every committed token."""
    proposer = Listening(hidden_layers=layers)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3]
    result = Engine(target, proposer, k=3).generate(prompt, SamplingParams(max_tokens=30))
    seq_id = next(iter(proposer.hidden))
    got = torch.cat(proposer.hidden[seq_id])
    committed = prompt + result.token_ids
    want = _fresh_hidden(target, committed[:-1], layers)  # the last committed token is not cached yet
    assert got.shape == want.shape == (len(committed) - 1, target.config.hidden_size * (len(layers) + 1))
    assert torch.equal(got, want)
    steps = proposer.steps[seq_id]
    assert any(d == 0 for d, _ in steps), "some steps drafted nothing"
    assert len(steps) == result.stats.steps, "the proposer heard every step, drafted or not"


def test_scheduler_hands_every_sequence_its_own_hidden_states_and_every_step(target):
    proposer = Listening()
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 8], [0, 5, 10, 15, 20, 5, 10, 3, 3, 3]]
    scheduler = Scheduler(target, proposer, SchedulerConfig(max_batch=4, k=3, adaptive_k=False))
    results = run_scheduler(scheduler, [(p, SamplingParams(max_tokens=20)) for p in prompts])
    by_prompt = {tuple(h[0].shape): sid for sid, h in proposer.hidden.items()}
    for prompt, result in zip(prompts, results):
        seq_id = by_prompt[(len(prompt), target.config.hidden_size)]
        committed = prompt + result.token_ids
        got = torch.cat(proposer.hidden[seq_id])
        assert torch.equal(got, _fresh_hidden(target, committed[:-1]))
        assert len(proposer.steps[seq_id]) == result.stats.steps
        assert any(d == 0 for d, _ in proposer.steps[seq_id])


@pytest.mark.parametrize("case", PROPOSER_CASES, ids=[c.name for c in PROPOSER_CASES])
def test_batched_greedy_equals_plain_for_every_proposer_with_ragged_batches(case, target):
    """Several requests of different lengths share steps (drafts of different lengths, sequences
    joining and leaving): each one's greedy output is its plain output."""
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 8, 9, 10, 11, 7, 7, 8], [0, 5, 10], [2, 2, 2, 2, 2, 2], [9]]
    lengths = [24, 9, 17, 30, 5]
    params = [SamplingParams(max_tokens=n) for n in lengths]
    want = [Engine(target).generate(p, sp).token_ids for p, sp in zip(prompts, params)]
    proposer = make_proposer(case, target)
    scheduler = Scheduler(target, proposer, SchedulerConfig(max_batch=3, k=4, adaptive_k=False))
    results = run_scheduler(scheduler, list(zip(prompts, params)))
    for i in range(len(prompts)):
        assert results[i].token_ids == want[i], f"{case.name}: request {i} differs from plain"
    assert scheduler.stats.drafted > 0, f"{case.name} never drafted: the check proved nothing"


# -- options belong to their method ---------------------------------------------------------------


def test_an_option_the_method_does_not_read_is_an_error_naming_it(target):
    with pytest.raises(AuguryError, match=r"--ngram-max is not an option of draft method 'suffix'"):
        build_proposer("suffix", target, ngram_max=3)
    with pytest.raises(AuguryError, match=r"--skip-layers is not an option of plain decoding"):
        build_proposer("plain", target, skip_layers="1")
    assert build_proposer("ngram", target, ngram_min=2, ngram_max=3).ngram_max == 3


def test_cli_refuses_an_unused_option_with_one_line(capsys):
    from augury.cli import main

    code = main(["generate", "--draft-method", "ngram", "--draft-vocab", "100", "hello"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--draft-vocab is not an option of draft method 'ngram'" in err


def test_bench_refuses_an_option_no_given_method_reads(tmp_path, capsys):
    from augury.proposers.options import NgramOptions, SuffixOptions, split_options

    split = split_options({"ngram_max": 3, "dtype": "fp32"}, {"ngram": NgramOptions, "suffix": SuffixOptions})
    assert split == {"ngram": {"ngram_max": 3, "dtype": "fp32"}, "suffix": {"dtype": "fp32"}}
    with pytest.raises(AuguryError, match="--skip-layers is not an option of any of the methods given"):
        split_options({"skip_layers": "1"}, {"ngram": NgramOptions})


# -- the KV cache's own API ---------------------------------------------------------------------


def test_the_cache_slack_holds_the_longest_verification_block():
    """`slots_for` sizes every cache; the engine's target cache must take a whole block of MAX_K drafts
    plus the token before them past the sequence's last slot, and a drafter must keep some room."""
    assert SLACK >= MAX_K + 1, f"SLACK {SLACK} leaves no room for a block of MAX_K {MAX_K} drafts"
    assert slots_for(10, 5) == 15 + SLACK
    assert draft_room(slots_for(10), 10) == SLACK - DRAFT_MARGIN > 0
    assert draft_room(8, 10) == 0


def test_row_views_share_the_pools_lengths_and_rows_move_with_their_slots():
    pool = KVCache(num_layers=1, batch_size=3, num_kv_heads=1, head_dim=2, max_len=8, dtype=torch.float32)
    view = pool.rows(1, 3)
    view.keys[0][:, :, :4] = torch.arange(2 * 4 * 2, dtype=torch.float32).view(2, 1, 4, 2)
    view.advance(4)
    view.truncate([3, 2])
    assert pool.lengths == [0, 3, 2]  # the pool sees what its view did
    pool.move_row(2, 1)
    assert pool.lengths == [0, 2, 2]
    assert torch.equal(pool.keys[0][1, :, :2], pool.keys[0][2, :, :2])
    with pytest.raises(ValueError, match="cannot truncate"):
        view.truncate([3, 2])


def test_a_tree_block_mask_with_explicit_positions_equals_each_branch_alone(target):
    """The decoder's tree arguments: two branches verified in one forward (block_mask, positions)
    give each branch's logits as if it were fed alone. (Compacting the chosen branch in the cache
    comes with tree verification itself.)"""
    decoder = target.decoder
    prefix = torch.tensor([[1, 2, 3, 4]])
    # tree: root r, then branch A (a1, a2) and branch B (b1); slots r, a1, a2, b1
    tree = torch.tensor([[5, 6, 7, 8]])
    positions = torch.tensor([[4, 5, 6, 5]])
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0], [1, 0, 0, 1]], dtype=torch.bool)
    cache = decoder.new_cache(1, 32)
    decoder.forward(prefix, cache)
    tree_logits = decoder.forward(tree, cache, positions=positions, block_mask=mask)

    ref = decoder.new_cache(1, 32)
    decoder.forward(prefix, ref)
    branch_b = decoder.forward(torch.tensor([[5, 8]]), ref)
    assert torch.equal(tree_logits[:, [0, 3]], branch_b)
    ref_a = decoder.new_cache(1, 32)
    decoder.forward(prefix, ref_a)
    assert torch.equal(tree_logits[:, :3], decoder.forward(torch.tensor([[5, 6, 7]]), ref_a))


# -- the measured padding -----------------------------------------------------------------------


def test_calibration_finds_the_padding_that_avoids_a_row_dependent_kernel():
    """A matmul that rounds differently below 4 rows (as a GEMV path does) is invariant only when
    padded to at least 4; the calibration must find that, not assume it."""
    from augury.calibration import calibrate

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


def test_calibration_pads_only_the_row_counts_a_kernel_rounds_differently():
    """Like oneDNN's packed bf16 weights on an AMX CPU: rows agree for 2-11 rows and for multiples
    of 32, not alone and not for 12-31. The table must keep 2-11 as they are (no padding to 32 for
    a 5-row verification), send 1 to 2 and 12-32 to 32, and split longer matmuls into pieces the
    table covers, since no row multiple agrees with 2-11 past the table."""
    from augury.calibration import calibrate

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
    import json

    from augury.calibration import RowPadding, load_or_calibrate

    path = tmp_path / "padding.json"
    path.write_text(json.dumps({"key": "machine-a", "padding": {"multiple": 32, "minimum": 32, "checked_rows": 48}}))
    measured = RowPadding((1, 2, 3), 4, 3)
    assert load_or_calibrate(path, "machine-a", lambda: measured) == measured
    assert load_or_calibrate(path, "machine-a", lambda: RowPadding()) == measured, "the new file is kept"


def test_calibration_is_cached_with_the_model_and_measured_again_on_another_machine(tmp_path):
    from augury.calibration import RowPadding, load_or_calibrate

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


# -- logprobs and min_tokens through the step ---------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_logprobs_with_speculation_are_bitwise_those_of_plain_decoding(target, temperature):
    """The target scores every committed token during verification anyway: the logprobs it reports
    for a speculative run equal plain decoding's for the same tokens, bit for bit (greedy), and are
    the log of the distribution the tokens were drawn from (sampled, seeded)."""
    params = SamplingParams(temperature=temperature, seed=5, max_tokens=24, logprobs=3, repetition_penalty=1.1)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3]
    plain = Engine(target).generate(prompt, params)
    spec = Engine(target, make_proposer(PROPOSER_CASES[0], target), k=4).generate(prompt, params)
    assert spec.stats.drafted > 0
    assert len(plain.logprobs) == len(plain.token_ids)
    assert [lp.token for lp in plain.logprobs] == plain.token_ids
    for lp in plain.logprobs:
        assert len(lp.top) == 3 and lp.top[0][1] >= lp.top[1][1] >= lp.top[2][1] and lp.logprob <= 0.0
    if temperature == 0.0:
        assert spec.token_ids == plain.token_ids
        assert spec.logprobs == plain.logprobs
        assert all(lp.top[0][0] == lp.token for lp in plain.logprobs), "greedy tokens are the most likely"


def test_min_tokens_holds_back_eos_and_stop_strings_in_speculation_like_plain():
    model = tiny_model(vocab=VOCAB, seed=3, hidden=32, layers=2, eos_id=2)
    prompt = [1, 2, 3, 4, 5, 1, 2, 3]
    free = Engine(model).generate(prompt, SamplingParams(max_tokens=40))
    assert free.finish_reason == "stop" and len(free.token_ids) < 10, "the test needs an early EOS"
    params = SamplingParams(max_tokens=40, min_tokens=20, stop=("c",))
    plain = Engine(model).generate(prompt, params)
    spec = Engine(model, make_proposer(PROPOSER_CASES[0], model), k=4).generate(prompt, params)
    assert len(plain.token_ids) >= 20 and 2 not in plain.token_ids[:20]
    assert spec.token_ids == plain.token_ids


# -- coupled sampling through the drivers ---------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("case", PROPOSER_CASES, ids=[c.name for c in PROPOSER_CASES])
def test_a_seed_gives_the_same_text_with_or_without_speculation(case, temperature, target):
    """Coupled sampling: for every drafter and K, alone in the engine or batched in the scheduler,
    a seeded request's tokens are exactly plain decoding's with the same seed."""
    prompts = [[1, 2, 3, 4, 5, 1, 2, 3], [7, 7, 8, 9, 10, 11, 7, 7, 8], [0, 5, 10, 15]]
    jobs = [(p, SamplingParams(temperature=temperature, top_p=0.9, repetition_penalty=1.2, seed=11 + i,
                               max_tokens=24)) for i, p in enumerate(prompts)]
    assert all(params.mode == "coupled" for _, params in jobs)
    want = [Engine(target).generate(p, params).token_ids for p, params in jobs]
    proposer = make_proposer(case, target)
    drafted = 0
    for k in (1, 4, 8):
        for (prompt, params), expected in zip(jobs, want):
            spec = Engine(target, proposer, k=k).generate(prompt, params)
            assert spec.token_ids == expected, f"{case.name} K={k}: the seed's text changed with speculation"
            drafted += spec.stats.drafted
    scheduler = Scheduler(target, make_proposer(case, target), SchedulerConfig(max_batch=3, k=4))
    assert [r.token_ids for r in run_scheduler(scheduler, jobs)] == want
    assert drafted > 0


def test_rejection_sampling_stays_available_and_is_reported():
    params = SamplingParams(temperature=0.7, seed=3, coupling="rejection")
    assert params.mode == "rejection" and SamplingParams(temperature=0.7).mode == "rejection"
    assert SamplingParams().mode == "greedy" and SamplingParams(temperature=0.7, seed=1).mode == "coupled"
    with pytest.raises(AuguryError, match="coupling must be one of"):
        SamplingParams(coupling="gumbel")


def test_the_planner_starts_from_the_measured_cost_curve():
    """A profile's curve (forward ms by new tokens) is the planner's prior before it measured anything:
    with verification that costs 3x one token at 5 tokens, a sequence alone is not drafted for at
    a middling acceptance; with a flat curve it is."""
    from augury.planner import DraftOdds, Planner, plan_step

    odds = [DraftOdds.independent(0.5, 4)]
    steep = Planner(4, batched=False, curve={1: 30.0, 2: 40.0, 4: 70.0, 5: 90.0})
    flat = Planner(4, batched=False, curve={1: 30.0, 2: 30.5, 4: 31.0, 5: 31.5})
    for planner in (steep, flat):
        planner.costs.observe_draft(1, 4, 4 * 0.003)
    assert plan_step(steep.costs, odds, [10], [None], 4, choices=(0, 4)) == [0]
    assert plan_step(flat.costs, odds, [10], [None], 4, choices=(0, 4)) == [4]


@pytest.mark.parametrize("driver", ["engine", "scheduler"])
def test_the_planner_drafts_only_where_the_cost_curve_lets_drafting_pay(driver, target, monkeypatch):
    """Synthetic curves, a drafter that is always right (the target drafting for itself): where each
    drafted token costs two plain steps the plan settles on K = 0, where verification is free on K = 4."""
    import augury.scheduler
    from augury.proposers.draft_model import DraftModelProposer

    steep = {1: 30.0, 2: 90.0, 3: 150.0, 4: 210.0, 5: 270.0}
    flat = {1: 30.0, 2: 30.1, 3: 30.2, 4: 30.3, 5: 30.4}

    def curve_only(planner) -> None:
        """The plan rests on the synthetic curve alone, not on this machine's timings of a tiny model."""
        planner.costs.observe_target = lambda *args: None

    params = SamplingParams(max_tokens=48, ignore_eos=True)
    prompts = [[1, 2, 3, 4, 5, 6], [9, 8, 7, 6]]
    for curve, want in ((steep, 0), (flat, 4)):
        proposer = DraftModelProposer(target, VOCAB)
        if driver == "engine":
            engine = Engine(target, proposer, k=4, adaptive=True, curve=curve)
            curve_only(engine.planner)
            result = engine.generate(prompts[0], params)
            note = engine.last_plan
            assert note.settled_k == want, f"{note.line()}"
            assert note.k_counts[want] > sum(note.k_counts) / 2, f"most steps should run K={want}: {note.line()}"
            assert (note.expected_gain > 1.5) == (want > 0), note.line()
            assert result.token_ids == Engine(target).generate(prompts[0], params).token_ids
        else:
            monkeypatch.setattr(augury.scheduler, "_cost_curve", lambda model, c=curve: c)
            scheduler = Scheduler(target, proposer, SchedulerConfig(max_batch=2, k=4))
            curve_only(scheduler.planner)
            planned, plan = [], scheduler.planner.plan
            scheduler.planner.plan = lambda requests: planned.append(plan(requests)) or planned[-1]
            run_scheduler(scheduler, [(p, params) for p in prompts])
            both = [ks for ks in planned[5:] if len(ks) == 2]  # after the warm-up, while both run
            assert both and sum(max(ks) == want for ks in both) > len(both) / 2, f"K={want} expected: {both}"


def test_head_methods_take_their_head_file_as_an_option(tmp_path):
    """--head is an option of the head methods (and refused elsewhere); a missing file is one clear error."""
    target = tiny_model(vocab=VOCAB, seed=3, hidden=32, layers=3)
    with pytest.raises(AuguryError, match="needs --head"):
        build_proposer("eagle", target)
    with pytest.raises(AuguryError, match=str(tmp_path / "none")):
        build_proposer("mtp", target, head=str(tmp_path / "none"))
    with pytest.raises(AuguryError, match="--head is not an option of draft method 'ngram'"):
        build_proposer("ngram", target, head="x")


def test_a_batched_drafter_start_equals_starting_each_alone():
    """Sequences started together (one prefill per group of like-length prompts, caches as rows of one
    pool) hold what starting each alone holds: the same fed count and the same next drafts."""
    from augury.proposers.base import Sequence
    from augury.proposers.draft_model import DraftModelProposer

    draft = tiny_model(vocab=16, seed=3, hidden=32, layers=2)
    params = SamplingParams(max_tokens=8)
    prompts = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], [3], [4, 5, 6, 7, 8, 9, 10], [2, 2, 3], [5, 6, 7, 8, 9, 10]]

    def drafts(batched: bool) -> list[tuple[int, list[int]]]:
        proposer = DraftModelProposer(draft, 16)
        seqs = [Sequence(list(p), params) for p in prompts]
        if batched:
            proposer.start_batch(seqs)
        else:
            for seq in seqs:
                proposer.start(seq)
        fed = [proposer.states[seq.id].fed for seq in seqs]
        proposed = proposer.propose_batch(seqs, [3] * len(seqs))
        return list(zip(fed, [d.tokens for d in proposed]))

    together = drafts(batched=True)
    assert together == drafts(batched=False)
    assert [fed for fed, _ in together] == [len(p) - 1 for p in prompts]
    assert all(len(tokens) == 3 for _, tokens in together)


def test_a_burst_of_requests_starts_its_drafters_in_few_forwards():
    """Five requests admitted together start the model drafter in one forward per group of like-length
    prompts (here two groups), not one forward each."""
    from augury.proposers.base import Sequence
    from augury.proposers.draft_model import DraftModelProposer

    proposer = DraftModelProposer(tiny_model(vocab=16, seed=3, hidden=32, layers=2), 16)
    params = SamplingParams(max_tokens=8)
    proposer.start_batch([Sequence([1] * n, params) for n in (9, 8, 7, 3, 3)])
    assert proposer.forwards == 2
