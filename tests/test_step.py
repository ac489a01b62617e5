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
    _, hidden = target.decoder.forward_states(torch.tensor([tokens]), cache, states=layers)
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


# -- the KV cache's own API ---------------------------------------------------------------------


def test_the_cache_slack_holds_the_longest_verification_block():
    """`slots_for` sizes every cache; the engine's target cache must take a whole block of MAX_K drafts
    plus the token before them past the sequence's last slot, and a drafter must keep some room."""
    assert SLACK >= MAX_K + 1, f"SLACK {SLACK} leaves no room for a block of MAX_K {MAX_K} drafts"
    assert slots_for(10, 5) == 15 + SLACK
    assert draft_room(slots_for(10), 10) == SLACK - DRAFT_MARGIN > 0
    assert draft_room(8, 10) == 0


@pytest.mark.parametrize("rows", [3, 12])
@pytest.mark.parametrize("block", [1, 4])
def test_a_ragged_write_puts_each_rows_block_after_its_own_length(rows, block):
    """`KVCache.write` on rows of different lengths (row by row for a few, one indexed copy for many):
    each row's new slots hold its own block, and no other slot changes."""
    gen = torch.Generator().manual_seed(rows + block)
    cache = KVCache(num_layers=2, batch_size=rows, num_kv_heads=2, head_dim=3, max_len=16, dtype=torch.float32)
    for tensors in (cache.keys, cache.values):
        for t in tensors:
            t.copy_(torch.randn(t.shape, generator=gen))
    cache.lengths = [(5 * b) % 11 for b in range(rows)]
    before_keys = [k.clone() for k in cache.keys]
    k_new, v_new = torch.randn(rows, 2, block, 3, generator=gen), torch.randn(rows, 2, block, 3, generator=gen)
    cache.write(1, k_new, v_new)
    expected = before_keys[1].clone()
    for b, start in enumerate(cache.lengths):
        expected[b, :, start : start + block] = k_new[b]
        assert torch.equal(cache.values[1][b, :, start : start + block], v_new[b])
    assert torch.equal(cache.keys[1], expected)
    assert torch.equal(cache.keys[0], before_keys[0]), "another layer's slots are untouched"


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


def test_a_sequences_rows_move_fill_and_copy_out_in_every_layer_and_only_its_own():
    """fill, copy_rows and move_row work on the pool's one tensor for all layers at once (41d): each must
    reach every layer's slots of its own row, through the layers' views and a row view alike, and no other row."""
    layers, slots = 3, 8
    pool = KVCache(num_layers=layers, batch_size=3, num_kv_heads=2, head_dim=4, max_len=slots, dtype=torch.float32)
    keys = torch.randn(layers, 2, 5, 4)
    values = torch.randn(layers, 2, 5, 4)
    view = pool.rows(1, 3)
    view.fill(1, keys, values)  # the pool's row 2
    assert pool.lengths == [0, 0, 5]
    for layer in range(layers):
        assert torch.equal(pool.keys[layer][2, :, :5], keys[layer])
        assert torch.equal(view.values[layer][1, :, :5], values[layer])
        assert not pool.keys[layer][:2].any(), "rows 0 and 1 are untouched"
    out_keys, out_values = pool.copy_rows(2, 1, 4)
    assert torch.equal(out_keys, keys[:, :, 1:4]) and torch.equal(out_values, values[:, :, 1:4])
    out_keys.zero_()  # a copy, not a view of the pool
    assert torch.equal(pool.keys[0][2, :, 1:4], keys[0, :, 1:4])
    pool.move_row(2, 0)
    assert pool.lengths == [5, 0, 5]
    for layer in range(layers):
        assert torch.equal(pool.keys[layer][0, :, :5], keys[layer])
        assert torch.equal(pool.values[layer][0, :, :5], values[layer])
        assert not pool.keys[layer][1].any()


def test_the_native_layers_cache_views_follow_every_later_write_and_move():
    """`sequence_kv` makes its per-sequence views once per storage (42): a fill, a write and a move made
    after they were first handed out must show through them, and a row view gets views of its own rows."""
    layers = 2
    pool = KVCache(num_layers=layers, batch_size=3, num_kv_heads=2, head_dim=4, max_len=6, dtype=torch.float32)
    before = [pool.sequence_kv(layer) for layer in range(layers)]
    keys, values = torch.randn(layers, 2, 3, 4), torch.randn(layers, 2, 3, 4)
    pool.fill(2, keys, values)
    pool.move_row(2, 0)
    view = pool.rows(0, 1)
    view.write(1, torch.ones(1, 2, 1, 4), torch.full((1, 2, 1, 4), 2.0))  # slot 3 of the pool's row 0, layer 1
    for layer in range(layers):
        seq_keys, seq_values = pool.sequence_kv(layer)
        assert seq_keys is before[layer][0] and len(seq_keys) == 3
        assert torch.equal(seq_keys[0][:, :3], keys[layer]) and torch.equal(seq_values[0][:, :3], values[layer])
        own_keys, _ = view.sequence_kv(layer)
        assert len(own_keys) == 1 and own_keys[0].data_ptr() == seq_keys[0].data_ptr()
    assert pool.rows(0, 1) is view and pool.rows(0, 2) is not view  # each span's view made once
    assert pool.rows(0, 2).lengths == pool.lengths[:2]
    assert torch.equal(pool.sequence_kv(1)[0][0][:, 3], torch.ones(2, 4))
    assert torch.equal(pool.sequence_kv(1)[1][0][:, 3], torch.full((2, 4), 2.0))


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


def test_sampled_requests_with_the_same_controls_share_one_distribution_call_bit_for_bit(target, monkeypatch):
    """The step computes p_target for the rows of every sampled request with the same temperature and
    truncation in one call (a call per request cost a 16-row sampled server step about 12 ms), and each
    request's rows get the bits its own `probabilities` call gives, penalties and draft history included."""
    import augury.step as step_module
    from augury.sampling import probabilities

    sampled = dict(temperature=0.8, top_p=0.9, max_tokens=12)
    jobs = [([1, 2, 3, 4], SamplingParams(seed=1, **sampled)), ([5, 6, 7], SamplingParams(seed=2, **sampled)),
            ([2, 2, 9, 9], SamplingParams(seed=3, repetition_penalty=1.4, frequency_penalty=0.5, **sampled)),
            ([4, 3, 2], SamplingParams(seed=4, temperature=1.2, top_k=5, max_tokens=12)),
            ([8, 1, 8], SamplingParams(max_tokens=12))]
    calls: list[int] = []
    real_distribution, real_verify = step_module.distribution, step_module._verify_and_commit
    checked = []

    def counting(logits, params):
        calls.append(logits.shape[0])
        return real_distribution(logits, params)

    def verify(request, logits, p_target=None):
        if not request.params.greedy:
            alone = probabilities(logits, request.params, request.seq.prompt, request.seq.output, request.draft.tokens)
            assert p_target is not None and torch.equal(p_target, alone), "a batched p_target differs from its own"
            checked.append(request.seq.id)
        return real_verify(request, logits, p_target)

    monkeypatch.setattr(step_module, "distribution", counting)
    monkeypatch.setattr(step_module, "_verify_and_commit", verify)
    run_scheduler(Scheduler(target, Listening(), SchedulerConfig(max_batch=5, k=1, adaptive_k=False)), jobs)
    assert len(set(checked)) == 4, f"sampled requests checked: {sorted(set(checked))}"
    # k = 1: one request's rows are at most 2, so a call of 3 or more holds several requests' rows.
    assert max(calls) >= 3, f"no call held several requests' rows: {calls}"
