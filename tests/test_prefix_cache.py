"""The prefix cache: rows of earlier sequences reused, never another prefix's, under a budget, gone with a disconnect.

Bits: a prompt of at most the decoder's row-attention limit (64 tokens) is
prefilled row by row, each row's bits its own, so rows read from the cache are
the bits a fresh prefill writes and greedy text is identical (tested for every
drafter). A longer prompt's fresh prefill is one masked call whose matmuls'
bits depend on the row count, so there the test bounds how far the served
distribution at every position is from the uncached one (exactly, not by
sampling: 1e-5 in log-probability, where serving another prefix's rows moves
it by whole units).
"""

from __future__ import annotations

import random
import threading
from collections import Counter

import pytest
import torch

from augury.cli import main
from augury.engine import Engine
from augury.errors import AuguryError
from augury.prefix_cache import PrefixCache
from augury.sampling import SamplingParams
from augury.scheduler import Failed, Finished, Scheduler, SchedulerConfig
from augury.server.prometheus import render
from tests.proposer_cases import PROPOSER_CASES, make_proposer
from tests.tiny import DecoderHook, tiny_model

VOCAB = 24
BLOCK = 4
BUDGET = 10**7


@pytest.fixture(scope="module")
def target():
    return tiny_model(vocab=VOCAB, seed=3, hidden=32, layers=3)


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class Recording(DecoderHook):
    """Wraps a decoder: records each forward's block width; `during(width)` may act inside a forward."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.widths: list[int] = []
        self.during = None

    def before(self, tokens) -> None:
        self.widths.append(tokens.shape[1])
        if self.during is not None:
            self.during(tokens.shape[1])


def generate(scheduler: Scheduler, prompt: list[int], params: SamplingParams):
    """One request through a running scheduler, waited for; its result."""
    ended = []
    done = threading.Event()

    def on_event(event) -> None:
        if isinstance(event, (Finished, Failed)):
            ended.append(event)
            done.set()

    scheduler.submit(prompt, params, on_event)
    assert done.wait(300), "the scheduler stopped answering"
    assert isinstance(ended[0], Finished), ended[0]
    return ended[0].result


def one_by_one(scheduler: Scheduler, prompts: list[list[int]], params: SamplingParams) -> list:
    """Each prompt alone, after the previous one finished (so it can read that one's rows)."""
    scheduler.start()
    try:
        return [generate(scheduler, prompt, params) for prompt in prompts]
    finally:
        scheduler.stop()


def chat_prompts() -> list[list[int]]:
    """Prompts that share starts: a system prompt with two questions, then a second turn of the first (<= 64 tokens)."""
    system = tokens(21, seed=1)
    first, second = system + tokens(6, seed=2), system + tokens(9, seed=3)
    return [first, second, first[:-1] + [(first[-1] + 1) % VOCAB]]


# -- greedy text: identical with and without the cache, for every drafter ---------------------


@pytest.mark.parametrize("case", [None, *PROPOSER_CASES], ids=["plain", *[c.name for c in PROPOSER_CASES]])
def test_greedy_text_is_identical_with_and_without_the_prefix_cache(case, target):
    params = SamplingParams(max_tokens=12)
    prompts = chat_prompts()
    plain = Engine(target)
    first = plain.generate(prompts[0], params).token_ids
    prompts.append(prompts[0] + first + tokens(5, seed=4))  # the chat's second turn: history + answer + question
    want = [plain.generate(p, params).token_ids for p in prompts]
    proposer = make_proposer(case, target) if case is not None else None
    config = SchedulerConfig(max_batch=2, k=4, adaptive_k=False, prefix_cache_bytes=BUDGET, prefix_block=BLOCK)
    scheduler = Scheduler(target, proposer, config)
    got = [r.token_ids for r in one_by_one(scheduler, prompts, params)]
    assert got == want, f"{case and case.name}: text with the prefix cache differs from plain greedy"
    cache = scheduler.prefix
    assert cache.hits == 3 and cache.saved_tokens >= 3 * 20, f"the cache served too little: {cache.hits} hits"
    if case is not None and case.name == "model-context":
        # its rows of a prompt longer than its context start past position 0: nothing to share
        assert scheduler.draft_prefix is not None and scheduler.draft_prefix.bytes == 0
    elif case is not None and case.name.startswith(("model", "quantized", "layerskip", "hybrid")):
        assert scheduler.draft_prefix is not None and scheduler.draft_prefix.hits > 0, "the drafter never reused rows"
    if case is not None:
        assert scheduler.stats.drafted > 0, f"{case.name} never drafted: the check proved nothing"


def test_a_drafter_that_reads_the_prompts_states_skips_the_cache(target):
    from tests.test_step import Listening

    scheduler = Scheduler(target, Listening(), SchedulerConfig(max_batch=2, k=3, prefix_cache_bytes=BUDGET))
    assert scheduler.prefix is None and scheduler.draft_prefix is None
    one_by_one(scheduler, chat_prompts(), SamplingParams(max_tokens=6))  # Listening asserts it saw every state


# -- rows are reused, counted in prefill tokens and in /metrics --------------------------------


def test_a_second_request_sharing_a_prefix_prefills_only_the_rest(target):
    model = tiny_model(vocab=VOCAB, seed=3, hidden=32, layers=3)
    recording = model.decoder = Recording(model.decoder)
    config = SchedulerConfig(max_batch=2, prefix_cache_bytes=BUDGET, prefix_block=16)
    scheduler = Scheduler(model, None, config)
    shared = tokens(35, seed=5)
    params = SamplingParams(max_tokens=3)
    prefills = []
    scheduler.start()
    for prompt in (shared + [1, 2], shared + [3, 4, 5]):
        recording.widths.clear()
        generate(scheduler, prompt, params)
        prefills.append(recording.widths[0])
    scheduler.stop()
    # two whole blocks and the first request's tail of 3 shared tokens (35 = 2 x 16 + 3)
    assert prefills == [37, 38 - 35], "the second prompt should prefill only past the 35 tokens it shares"
    text = render(scheduler, Counter())
    for line in ('augury_prefix_cache_hits_total{model="target"} 1',
                 'augury_prefix_cache_misses_total{model="target"} 1',
                 'augury_prefix_cache_saved_tokens_total{model="target"} 35',
                 f'augury_prefix_cache_bytes{{model="target"}} {scheduler.prefix.bytes}',
                 f'augury_prefix_cache_reserved_bytes{{model="target"}} {scheduler.prefix.reserved}'):
        assert line in text.splitlines(), f"{line!r} missing from /metrics"
    assert 0 < scheduler.prefix.bytes < scheduler.prefix.reserved <= BUDGET


# -- never another prefix's rows ----------------------------------------------------------------


def fresh_rows(target, seq: list[int]):
    """The keys and values a fresh prefill writes for seq: [layers, H_kv, len, D] each."""
    cache = target.decoder.new_cache(1, len(seq) + 8)
    target.decoder.forward(torch.tensor([seq]), cache)
    return cache.copy_rows(0, 0, len(seq))


def stored_cache(target, seqs: list[list[int]]) -> PrefixCache:
    prefix = PrefixCache(BUDGET, BLOCK)
    for seq in seqs:
        cache = target.decoder.new_cache(1, len(seq) + 8)
        target.decoder.forward(torch.tensor([seq]), cache)
        prefix.store(seq, cache)
    return prefix


def common(a: list[int], b: list[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def test_random_queries_get_exactly_their_own_prefixs_rows(target):
    """Over a 3-token vocabulary many stored sequences share starts; each query gets the longest start any
    stored sequence shares with it (whole blocks and tails), and those rows are bitwise a fresh prefill's of
    the query."""
    rng = random.Random(7)
    stored = [[rng.randrange(3) for _ in range(rng.randrange(5, 30))] for _ in range(8)]
    prefix = stored_cache(target, stored)
    for _ in range(60):
        query = rng.choice(stored)[: rng.randrange(1, 30)] + [rng.randrange(3) for _ in range(rng.randrange(0, 8))]
        limit = len(query) - 1
        want = min(limit, max(common(query, s) for s in stored))
        cache = target.decoder.new_cache(1, 64)
        got = prefix.take(query, limit, cache)
        assert got == want, f"served {got} rows for {query}, its longest cached start is {want}"
        if got:
            keys, values = fresh_rows(target, query)
            assert cache.lengths == [got]
            assert torch.equal(cache.copy_rows(0, 0, got)[0], keys[:, :, :got]), "served rows of another prefix"
            assert torch.equal(cache.copy_rows(0, 0, got)[1], values[:, :, :got])


@pytest.mark.parametrize("where", ["last token of a block", "last token of the prompt", "middle"])
def test_a_prompt_that_differs_gets_only_the_rows_before_the_difference(where, target):
    stored = tokens(24, seed=8)
    position = {"last token of a block": 15, "last token of the prompt": 23, "middle": 9}[where]
    query = list(stored)
    query[position] = (query[position] + 1) % VOCAB
    prefix = stored_cache(target, [stored])
    cache = target.decoder.new_cache(1, 64)
    assert prefix.take(query, len(query) - 1, cache) == position
    assert torch.equal(cache.copy_rows(0, 0, position)[0], fresh_rows(target, query)[0][:, :, :position])
    params = SamplingParams(max_tokens=10)
    scheduler = Scheduler(target, None, SchedulerConfig(max_batch=1, prefix_cache_bytes=BUDGET, prefix_block=BLOCK))
    got = one_by_one(scheduler, [stored, query], params)
    assert scheduler.prefix.saved_tokens == position
    assert got[1].token_ids == Engine(target).generate(query, params).token_ids


def test_rows_past_the_last_whole_block_are_kept_as_a_tail_until_a_block_holds_them(target):
    """A sequence of 2 blocks and 3 tokens keeps all 11 rows (the tail bitwise a fresh prefill's); a query
    sharing 10 of them reads 10; the same start stored again adds nothing; a longer sequence through the
    tail replaces it with a whole block, and a shorter tail under that block is not stored."""
    seq = tokens(2 * BLOCK + 3, seed=60)
    prefix = PrefixCache(BUDGET, BLOCK)
    assert prefix.store(seq, _cache_for(target, seq)) == 3 and len(prefix) == 3
    cache = target.decoder.new_cache(1, 64)
    assert prefix.take(seq + [0], len(seq), cache) == len(seq)
    keys, values = cache.copy_rows(0, 0, len(seq))
    want_keys, want_values = fresh_rows(target, seq)
    assert torch.equal(keys, want_keys) and torch.equal(values, want_values), "a tail's rows are not a prefill's"
    other = seq[:-1] + [(seq[-1] + 1) % VOCAB, 5]
    assert prefix.take(other, len(other) - 1, target.decoder.new_cache(1, 64)) == len(seq) - 1
    assert prefix.store(seq, _cache_for(target, seq)) == 0 and len(prefix) == 3
    longer = seq + tokens(BLOCK, seed=61)
    assert prefix.store(longer, _cache_for(target, longer)) == 2 and len(prefix) == 4, "the tail was not replaced"
    assert prefix.lookup(longer, len(longer)).length == len(longer) and prefix.bytes == 4 * prefix.block_bytes
    assert prefix.store(seq[:-1], _cache_for(target, seq[:-1])) == 0 and len(prefix) == 4


# -- the budget: least recently used leaves go first ----------------------------------------------


def _cache_for(target, seq: list[int]):
    """A cache holding a fresh prefill of seq."""
    cache = target.decoder.new_cache(1, len(seq) + 8)
    target.decoder.forward(torch.tensor([seq]), cache)
    return cache


def test_eviction_keeps_the_budget_and_drops_the_least_recently_used_leaf(target):
    a, b, c, d = (tokens(BLOCK, seed=s) for s in (10, 11, 12, 13))
    one = stored_cache(target, [a])
    prefix = PrefixCache(3 * one.bytes, BLOCK)  # room for three blocks
    for seq in (a, b, a + c):  # a, b, then a's child c (a is touched after c: a parent is never older)
        prefix.store(seq, _cache_for(target, seq))
    assert len(prefix) == 3 and prefix.bytes == 3 * one.bytes
    prefix.take(b + [0], BLOCK, target.decoder.new_cache(1, 16))  # b is now the most recently used
    prefix.store(d, _cache_for(target, d))
    assert prefix.bytes <= prefix.budget and prefix.evictions == 1
    assert prefix.lookup(a + c, 2 * BLOCK).length == BLOCK, "c, the least recently used, should have gone"
    assert prefix.lookup(b, BLOCK).length == BLOCK and prefix.lookup(d, BLOCK).length == BLOCK
    prefix.store(b + c, _cache_for(target, b + c))  # b's new child evicts a (a leaf now), never its own parent b
    assert prefix.lookup(a, BLOCK).length == 0 and prefix.lookup(b + c, 2 * BLOCK).length == 2 * BLOCK
    assert prefix.bytes <= prefix.budget and prefix.evictions == 2


def test_the_arena_is_reserved_at_start_and_evicted_slots_are_reused(target):
    """The budget is taken when the server is built (its memory does not grow as the cache fills), no store
    allocates, and a slot freed by eviction serves its new block's rows, not the old ones."""
    one = stored_cache(target, [tokens(BLOCK, seed=1)]).block_bytes
    proposer = make_proposer(PROPOSER_CASES[0], target)  # a model drafter: it gets the other part of the budget
    budget = 7 * one + one // 2
    scheduler = Scheduler(target, proposer, SchedulerConfig(max_batch=2, prefix_cache_bytes=budget, prefix_block=BLOCK))
    prefix, draft_prefix = scheduler.prefix, scheduler.draft_prefix
    assert draft_prefix is not None and draft_prefix.reserved > 0, "the drafter's arena was not reserved at start"
    assert 0 < prefix.reserved <= prefix.budget and prefix.reserved + prefix.block_bytes > prefix.budget
    assert prefix.bytes == 0 and draft_prefix.bytes == 0
    arena = prefix._keys.data_ptr(), prefix._values.data_ptr()
    slots = prefix.reserved // prefix.block_bytes
    seqs = [tokens(BLOCK, seed=40 + i) for i in range(slots + 2)]
    for seq in seqs:  # two more blocks than slots: the first two are evicted and their slots reused
        prefix.store(seq, _cache_for(target, seq))
    assert (prefix._keys.data_ptr(), prefix._values.data_ptr()) == arena and len(prefix) == slots
    assert prefix.evictions == 2 and prefix.lookup(seqs[0], BLOCK).length == 0
    for seq in seqs[2:]:
        want = _cache_for(target, seq)
        got = target.decoder.new_cache(1, 16)
        assert prefix.take(seq + [0], BLOCK, got) == BLOCK
        for layer in range(len(got.keys)):
            assert torch.equal(got.keys[layer][0, :, :BLOCK], want.keys[layer][0, :, :BLOCK])
            assert torch.equal(got.values[layer][0, :, :BLOCK], want.values[layer][0, :, :BLOCK])


def test_the_scheduler_stays_within_its_budget(target):
    one = stored_cache(target, [tokens(BLOCK, seed=1)]).bytes
    scheduler = Scheduler(target, None, SchedulerConfig(max_batch=2, prefix_cache_bytes=5 * one, prefix_block=BLOCK))
    scheduler.start()
    for seed in range(6):
        generate(scheduler, tokens(13, seed=20 + seed), SamplingParams(max_tokens=8))
        assert scheduler.prefix.bytes <= scheduler.prefix.budget
    scheduler.stop()
    assert scheduler.prefix.evictions > 0


# -- a disconnect frees its row and its cache entries at once --------------------------------------


@pytest.mark.parametrize("when", ["prefill", "first step"])
def test_a_disconnect_frees_its_row_and_its_own_cache_entries(when, target):
    model = tiny_model(vocab=VOCAB, seed=3, hidden=32, layers=3)
    recording = model.decoder = Recording(model.decoder)
    proposer = make_proposer(PROPOSER_CASES[0], model)
    config = SchedulerConfig(max_batch=2, k=3, adaptive_k=False, prefix_cache_bytes=BUDGET, prefix_block=BLOCK)
    scheduler = Scheduler(model, proposer, config)
    shared = tokens(17, seed=30)
    scheduler.start()
    generate(scheduler, shared + [1, 2, 3], SamplingParams(max_tokens=6))
    kept = scheduler.prefix.bytes, scheduler.draft_prefix.bytes
    assert kept[0] > 0 and kept[1] > 0
    ended = threading.Event()
    events = []

    def on_event(event) -> None:
        events.append(event)
        if isinstance(event, (Finished, Failed)):
            ended.set()

    ticket = scheduler.submit(shared + tokens(14, seed=31), SamplingParams(max_tokens=20), on_event)
    recording.widths.clear()
    # the prefill reads 15 tokens past the 16 cached; a step's block is at most k + 1 = 4
    recording.during = lambda width: scheduler.cancel(ticket) if (width > 4) == (when == "prefill") else None
    try:
        for _ in range(500):
            if scheduler.stats.cancelled:
                break
            ended.wait(0.01)
        assert scheduler.stats.cancelled == 1, "the request was never dropped"
        text = render(scheduler, Counter()).splitlines()
    finally:
        scheduler.stop()
    assert scheduler.running == 0 and scheduler.queue_length == 0
    assert (scheduler.prefix.bytes, scheduler.draft_prefix.bytes) == kept, "the cancelled request left blocks behind"
    assert "augury_running 0" in text and "augury_queue_length 0" in text
    assert f'augury_prefix_cache_bytes{{model="target"}} {kept[0]}' in text
    assert not any(isinstance(e, Finished) for e in events)


def test_a_disconnect_alone_leaves_every_gauge_at_zero(target):
    scheduler = Scheduler(target, None, SchedulerConfig(max_batch=1, prefix_cache_bytes=BUDGET, prefix_block=BLOCK))
    ticket = scheduler.submit(tokens(30, seed=40), SamplingParams(max_tokens=40), lambda event: None)
    scheduler.cancel(ticket)
    ticket2 = scheduler.submit(tokens(30, seed=41), SamplingParams(max_tokens=40), lambda event: None)
    original = scheduler._step

    def step_then_cancel() -> None:
        original()
        scheduler.cancel(ticket2)

    scheduler._step = step_then_cancel
    scheduler.start()
    try:
        for _ in range(500):
            if scheduler.stats.cancelled == 2 and scheduler.running == 0:
                break
            threading.Event().wait(0.01)
    finally:
        scheduler.stop()
    text = render(scheduler, Counter()).splitlines()
    for gauge in ("augury_running 0", "augury_queue_length 0", 'augury_prefix_cache_bytes{model="target"} 0'):
        assert gauge in text, f"{gauge!r} not in /metrics after the disconnects"
    assert len(scheduler.prefix) == 0


# -- prompts past the row-attention limit: the distribution, not the bits ---------------------------


def test_long_prompts_from_the_cache_keep_every_positions_distribution(target):
    """Past 64 tokens a fresh prefill is one masked call, so cached rows may differ in the last bits. The
    log-probability of every output token (seeded sampling, so the same tokens) stays within 1e-5 of
    the uncached run's; rows of another prefix would move it by whole units (checked below)."""
    shared = tokens(80, seed=50)
    prompt = shared + tokens(12, seed=51)
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=5, logprobs=0)
    want = Engine(target).generate(prompt, params)
    scheduler = Scheduler(target, None, SchedulerConfig(max_batch=1, prefix_cache_bytes=BUDGET, prefix_block=16))
    got = one_by_one(scheduler, [shared + [1], prompt], params)[1]
    assert scheduler.prefix.saved_tokens == 80
    assert got.token_ids == want.token_ids
    gap = max(abs(a.logprob - b.logprob) for a, b in zip(got.logprobs, want.logprobs))
    assert gap < 1e-5, f"a cached prefix moved a token's log-probability by {gap:.2e}"
    other = Engine(target).generate(tokens(80, seed=52) + prompt[80:], params)  # what another prefix gives
    assert max(abs(a.logprob - b.logprob) for a, b in zip(other.logprobs, want.logprobs)) > 1e-2


# -- configuration ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["-1", "nan", "inf", "abc", "", "1e9"])
def test_bad_prefix_cache_sizes_are_one_line_errors(value, capsys):
    assert main(["serve", "--model", "no-such-model", "--prefix-cache-gb", value]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--prefix-cache-gb" in err, err


def test_zero_disables_the_cache_and_a_negative_budget_is_refused(target):
    assert Scheduler(target, None, SchedulerConfig(prefix_cache_bytes=0)).prefix is None
    with pytest.raises(AuguryError, match="prefix cache budget"):
        Scheduler(target, None, SchedulerConfig(prefix_cache_bytes=-1))


def test_a_budget_the_free_memory_cannot_hold_is_refused_at_start(target, monkeypatch):
    """The arena is taken at start, so a budget past the memory free now is a one-line error there, not an
    out-of-memory kill; a budget that fits is taken whole."""
    import augury.prefix_cache as prefix_cache

    free = 3 * 10**6
    monkeypatch.setattr(prefix_cache, "free_memory", lambda device: free)
    with pytest.raises(AuguryError, match="does not fit the 0.00 GB of memory free") as error:
        Scheduler(target, None, SchedulerConfig(prefix_cache_bytes=BUDGET))
    assert "--prefix-cache-gb" in str(error.value) and "\n" not in str(error.value)
    scheduler = Scheduler(target, None, SchedulerConfig(prefix_cache_bytes=free))
    assert free - scheduler.prefix.block_bytes < scheduler.prefix.reserved <= free
    assert prefix_cache.PrefixCache(BUDGET).reserved == 0  # nothing is taken before the geometry is known
    monkeypatch.undo()
    assert prefix_cache.free_memory(torch.device("cpu")) > 0  # this CPU's MemAvailable is read


# -- through the HTTP API: a chat's second turn -------------------------------------------------------


def test_a_chats_second_turn_reads_the_first_turns_rows_through_the_api():
    """Two turns of one chat over /v1/chat/completions: the second prompt (history, answer, question) starts
    on the first turn's rows, and /metrics says so."""
    from starlette.testclient import TestClient

    from augury.server import ServerConfig, create_app
    from tests.test_server import MODEL, tiny_pair

    model, _ = tiny_pair()
    config = SchedulerConfig(max_batch=2, prefix_cache_bytes=BUDGET)
    app = create_app(model, Scheduler(model, None, config), ServerConfig(model_name=MODEL, max_tokens_limit=64))
    messages = [{"role": "system", "content": "You answer in short words"}, {"role": "user", "content": "Say hi"}]
    with TestClient(app, base_url="http://127.0.0.1") as client:
        first = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 24})
        assert first.status_code == 200, first.text
        answer = first.json()["choices"][0]["message"]["content"]
        messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": "Again"}]
        second = client.post("/v1/chat/completions", json={"model": MODEL, "messages": messages, "max_tokens": 8})
        assert second.status_code == 200, second.text
        metrics = client.get("/metrics").text.splitlines()
    assert 'augury_prefix_cache_hits_total{model="target"} 1' in metrics
    saved = next(line for line in metrics if line.startswith('augury_prefix_cache_saved_tokens_total{model="target"}'))
    # the first turn's whole blocks, answer included (the rows kept when it completed), as far as they match
    tokenizer = model.tokenizer
    history = tokenizer.encode_chat(messages[:2]) + tokenizer.encode(answer)
    kept = history[: (len(history) - 1) // 16 * 16]
    want = common(kept, tokenizer.encode_chat(messages))
    assert want > 32, "the chat is too short to show more than the first prompt's blocks"
    assert int(saved.split()[-1]) == want, f"the second turn reused {saved.split()[-1]} rows, not {want}"


def test_a_kv_pool_the_free_memory_cannot_hold_is_refused_at_start(target, monkeypatch):
    """--max-batch 100000 asked the allocator for 158 GB and died in a traceback: the pool's size is checked
    against the memory free now, in one line naming the options to lower."""
    import augury.scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "free_memory", lambda device: 10**6)
    with pytest.raises(AuguryError, match=r"KV cache for 100000 rows .* lower --max-batch") as error:
        Scheduler(target, None, SchedulerConfig(max_batch=100_000, prefix_cache_bytes=0))
    assert "\n" not in str(error.value)
    monkeypatch.setattr(scheduler_module, "free_memory", lambda device: 10**12)
    assert Scheduler(target, None, SchedulerConfig(max_batch=2, prefix_cache_bytes=0)).pool.batch_size == 2
