"""Prompts prefilled in pieces inside the decode steps: the same text, a bounded wait, no head-of-line blocking.

A new request's prompt enters the running batch in pieces, in the same target
forward as the decode rows (the decoder's ragged rows on the native layer,
`Decoder.forward_rows`), under a per-step budget. Each row of the native layer
is computed alone, so a prompt's rows have the same bits whichever pieces it
was cut into and whatever ran beside it: greedy text is identical alone, in a
batch and chunked at any budget. What a chunked prompt's rows share with a
whole-prompt prefill depends on its length: up to the row-attention limit (64
tokens) a whole prompt also runs on the native layer (identical text); past it
a whole prompt is one masked torch call (README's contract), so there the test
holds the chunked texts to each other.
"""

from __future__ import annotations

import threading

import pytest
import torch

from augury.engine import Engine
from augury.kernels import extension as ext_module
from augury.planner import Planner
from augury.sampling import SamplingParams
from augury.scheduler import Failed, Finished, Scheduler, SchedulerConfig, TextDelta
from tests.native_tiny import ARCHS, VOCAB, native_model
from tests.proposer_cases import PROPOSER_CASES, make_proposer
from tests.test_step import Listening
from tests.tiny import DecoderHook, run_scheduler, stream_then_late


@pytest.fixture(scope="module", autouse=True)
def _kernel():
    if ext_module.extension() is None:
        pytest.skip("the GGUF kernel extension cannot be built here: no native layer, no ragged rows")


@pytest.fixture(scope="module")
def target():
    return native_model("qwen2", seed=5)


@pytest.fixture(autouse=True)
def _pieces_pay(monkeypatch):
    """auto (prefill_chunk None) chunks where pieces prefill nearly as fast as whole prompts; the tiny model's
    own rates are whatever this machine gives, so the tests of auto's budget fix them (the decision itself:
    test_auto_prefills_in_pieces_only_where_pieces_are_nearly_as_fast)."""
    import augury.costs

    monkeypatch.setattr(augury.costs, "prefill_rates", lambda model: (100.0, 100.0))


def tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class Rows(DecoderHook):
    """Records every ragged forward's rows per sequence; `during(blocks)` may act inside one."""

    def __init__(self, inner) -> None:
        super().__init__(inner)
        self.forwards: list[list[int]] = []
        self.during = None

    def before_rows(self, blocks) -> None:
        self.forwards.append([len(b) for b in blocks])
        if self.during is not None:
            self.during(blocks)


# -- the decoder's ragged rows ----------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHS)
def test_ragged_rows_are_each_sequences_own_bits(arch):
    """Blocks of 1, 0, 7 and 3 rows in one forward: every row's logits and states are the bits the
    sequence gets alone; the cache of a sequence that brought no rows is untouched."""
    model = native_model(arch, seed=2)
    decoder = model.decoder
    prompts = [tokens(n, seed=10 + n) for n in (5, 8, 13, 9)]
    new = [tokens(n, seed=20 + n) for n in (1, 0, 7, 3)]
    pool = decoder.new_cache(4, 128)
    for b, prompt in enumerate(prompts):
        decoder.forward(torch.tensor([prompt]), pool.rows(b, b + 1))
    logits, hidden = decoder.forward_rows(new, pool, [0, 0, 5, 0], states=())
    assert pool.lengths == [6, 8, 20, 12]
    for b, prompt in enumerate(prompts):
        if not new[b]:
            assert logits[b].shape[0] == 0 and hidden[b].shape[0] == 0
            continue
        solo = decoder.new_cache(1, 128)
        decoder.forward(torch.tensor([prompt]), solo)
        want, states = decoder.forward_states(torch.tensor([new[b]]), solo, states=())
        first = 5 if b == 2 else 0
        assert torch.equal(logits[b], want[0, first:]), f"{arch}: sequence {b}'s logits differ from its own"
        assert torch.equal(hidden[b], states[0]), f"{arch}: sequence {b}'s states differ from its own"


# -- greedy text: alone, batched, chunked -----------------------------------------------------


CHUNKS = (0, 1, 5, None)  # off, one token a step, five, the planner's budget


@pytest.mark.parametrize("case", [None, *PROPOSER_CASES], ids=["plain", *[c.name for c in PROPOSER_CASES]])
def test_greedy_text_is_identical_alone_batched_and_chunked(case, target):
    params = SamplingParams(max_tokens=10)
    prompts = [(tokens(7, seed=n) * 10)[:n] for n in (3, 17, 40, 64)]  # repeats, for the matchers to draft
    want = [Engine(target).generate(p, params).token_ids for p in prompts]
    for chunk in CHUNKS:
        proposer = make_proposer(case, target) if case is not None else None
        config = SchedulerConfig(max_batch=4, k=3, adaptive_k=False, prefill_chunk=chunk)
        scheduler = Scheduler(target, proposer, config)
        got = [r.token_ids for r in run_scheduler(scheduler, [(p, params) for p in prompts])]
        assert got == want, f"{case and case.name}, chunk {chunk}: text differs from the plain engine's"
        assert scheduler.stats.prompts_in_pieces == (0 if chunk == 0 else len(prompts))
        # At one token a step a model drafter's own prefill, in pieces too, outlasts these 10-token requests.
        if case is not None and (chunk != 1 or getattr(proposer, "prefill_batch", None) is None):
            assert scheduler.stats.drafted > 0, f"{case.name} never drafted: the check proved nothing"


def test_prompts_past_the_row_attention_limit_give_one_text_at_every_budget(target):
    params = SamplingParams(max_tokens=8)
    prompts = [tokens(n, seed=n) for n in (65, 100, 150)]
    texts = []
    for chunk in (7, 64, None):
        scheduler = Scheduler(target, None, SchedulerConfig(max_batch=3, prefill_chunk=chunk))
        texts.append([r.token_ids for r in run_scheduler(scheduler, [(p, params) for p in prompts])])
    alone = [run_scheduler(Scheduler(target, None, SchedulerConfig(max_batch=1, prefill_chunk=13)), [(p, params)])[0]
             .token_ids for p in prompts]
    assert texts[0] == texts[1] == texts[2] == alone, "a long prompt's text depends on how it was cut"


def test_a_drafter_that_reads_the_prompts_states_gets_all_of_them(target):
    """A head reads the prompt's states at its start: cut into pieces, they are a whole prefill's."""
    listening = Listening(draft_every=2)
    prompt = tokens(30, seed=3)
    scheduler = Scheduler(target, listening, SchedulerConfig(max_batch=2, k=3, prefill_chunk=4))
    run_scheduler(scheduler, [(prompt, SamplingParams(max_tokens=6))])
    cache = target.decoder.new_cache(1, 64)
    _, whole = target.decoder.forward_states(torch.tensor([prompt]), cache, states=())
    (states,) = [hidden[0] for hidden in listening.hidden.values()]
    assert torch.equal(states, whole[0]), "the pieces' states differ from a whole prefill's"


# -- the wait of running streams, and fairness --------------------------------------------------


def test_the_budget_fills_a_step_to_the_rows_of_an_efficient_forward():
    """Synthetic costs: a forward takes 4 ms + 2 ms a row, so its rows per second reach 90% of their best
    (1 / 2 ms) at 18 rows. A step feeding prompts fills up to 18 rows, never with fewer than
    MIN_PROMPT_PIECE prompt tokens; with nothing decoding a prompt takes the whole limit."""
    curve = {rows: 4.0 + 2.0 * rows for rows in (1, 2, 4, 8, 16)}
    planner = Planner(4, batched=True, curve=curve)
    assert planner.step_rows(64) == 18 and planner.step_rows(10) == 10
    rate = lambda rows: rows / (4.0 + 2.0 * rows)  # noqa: E731
    assert rate(18) >= Planner.PREFILL_EFFICIENCY * 0.5 > rate(17)
    assert planner.prompt_budget(0, 64) == 64, "with nothing decoding nobody waits"
    assert [planner.prompt_budget(n, 64) for n in (1, 3, 10, 16, 40)] == [17, 15, 8, 8, 8]
    assert planner.prompt_budget(1, 6) == 6
    assert Planner(4, batched=True).prompt_budget(2, 64) == Planner.UNMEASURED_PIECE - 2


@pytest.mark.parametrize("chunk", [8, None])
def test_a_running_stream_gets_a_token_every_forward_while_a_prompt_enters(chunk):
    """Counted forwards, not wall time: while a 60-token prompt is prefilled, every forward carries
    the running stream's row and at most one budget of prompt rows."""
    model = native_model("qwen2", seed=5)
    rows = model.decoder = Rows(model.decoder)
    scheduler = Scheduler(model, None, SchedulerConfig(max_batch=2, prefill_chunk=chunk))
    events = stream_then_late(scheduler, (tokens(4, seed=1), SamplingParams(max_tokens=60, ignore_eos=True)),
                              (tokens(60, seed=2), SamplingParams(max_tokens=4)), before_late=rows.forwards.clear)
    assert any(isinstance(e, Finished) for e in events["late"]), events["late"][-1:]
    both = [f for f in rows.forwards if len(f) == 2]
    assert both, "the prompt never rode in the stream's forward"
    fed = 0
    for stream_rows, prompt_rows in both:
        if fed >= 60:
            break
        assert stream_rows == 1, f"a forward left the running stream out: {stream_rows, prompt_rows}"
        if chunk is not None:
            assert prompt_rows <= chunk, f"a forward fed {prompt_rows} prompt rows, over the budget of {chunk}"
        fed += prompt_rows
    assert fed == 60, f"the forwards fed {fed} of the prompt's 60 tokens"
    assert len(both) >= (60 + 7) // 8 if chunk else len(both) > 1


def test_a_short_prompt_is_not_held_behind_a_long_one(target):
    """A 300-token prompt admitted first, then short ones: the short ones' first tokens come first, and the
    long one still moves every step (half the budget), so it finishes too."""
    order: list[str] = []
    done = threading.Semaphore(0)

    def on(name):
        def handle(event) -> None:
            if isinstance(event, TextDelta) and name not in order:
                order.append(name)
            if isinstance(event, (Finished, Failed)):
                assert isinstance(event, Finished), event
                done.release()
        return handle

    scheduler = Scheduler(target, None, SchedulerConfig(max_batch=6, prefill_chunk=8))
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    scheduler.submit(tokens(300, seed=7), params, on("long"))
    for i in range(5):
        scheduler.submit(tokens(5 + i, seed=40 + i), params, on(f"short{i}"))
    scheduler.start()
    try:
        for _ in range(6):
            assert done.acquire(timeout=120), "a request never finished"
    finally:
        scheduler.stop()
    assert order[-1] == "long" and len(order) == 6, f"first tokens came in the order {order}"


def test_a_disconnect_mid_prefill_frees_its_row_and_every_gauge(target):
    from collections import Counter

    from augury.server.prometheus import render

    model = native_model("qwen2", seed=5)
    rows = model.decoder = Rows(model.decoder)
    scheduler = Scheduler(model, None, SchedulerConfig(max_batch=2, prefill_chunk=4, prefix_cache_bytes=10**7,
                                                      prefix_block=4))
    events = []
    ticket = scheduler.submit(tokens(40, seed=9), SamplingParams(max_tokens=8), events.append)
    rows.during = lambda blocks: scheduler.cancel(ticket) if len(rows.forwards) == 3 else None
    scheduler.start()
    try:
        for _ in range(1000):
            if scheduler.stats.cancelled and scheduler.running == 0:
                break
            threading.Event().wait(0.01)
        text = render(scheduler, Counter()).splitlines()
    finally:
        scheduler.stop()
    assert scheduler.stats.cancelled == 1 and scheduler.running == 0 and scheduler.prefilling == 0
    assert len(rows.forwards) < 10, "the cancelled prompt went on being prefilled"
    for gauge in ("augury_running 0", "augury_prefilling 0", 'augury_prefix_cache_bytes{model="target"} 0'):
        assert gauge in text, f"{gauge!r} not in /metrics after the disconnect"
    assert not any(isinstance(e, (Finished, TextDelta)) for e in events)


def test_bad_chunk_sizes_are_one_line_errors(target, capsys):
    from augury.cli import main
    from augury.errors import AuguryError

    with pytest.raises(AuguryError, match="prefill chunk"):
        Scheduler(target, None, SchedulerConfig(prefill_chunk=-1))
    for value in ("-3", "many"):
        assert main(["serve", "--model", "nothing-here", "--prefill-chunk", value]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "--prefill-chunk" in err[0], err


def test_past_the_row_attention_limit_the_prefix_cache_changes_no_text_when_prompts_come_in_pieces(target):
    """Every prompt's rows come from the native layer in pieces, so rows the prefix cache serves are the bits
    a fresh chunked prefill writes at any prompt length (a whole prefill past 64 tokens gives no such bits)."""
    params = SamplingParams(max_tokens=8)
    shared = tokens(90, seed=60)
    prompts = [shared + tokens(5, seed=61), shared + tokens(30, seed=62), shared[:70] + tokens(9, seed=63)]
    fresh = [run_scheduler(Scheduler(target, None, SchedulerConfig(max_batch=1, prefill_chunk=16)), [(p, params)])[0]
             .token_ids for p in prompts]
    config = SchedulerConfig(max_batch=1, prefill_chunk=16, prefix_cache_bytes=10**7, prefix_block=8)
    scheduler = Scheduler(target, None, config)
    cached = []
    scheduler.start()
    try:
        for prompt in prompts:
            done = threading.Event()
            ended = []
            scheduler.submit(prompt, params, lambda e: (ended.append(e), done.set()) if isinstance(
                e, (Finished, Failed)) else None)
            assert done.wait(120), "the scheduler stopped answering"
            cached.append(ended[0].result.token_ids)
    finally:
        scheduler.stop()
    assert scheduler.prefix.hits == 2 and scheduler.prefix.saved_tokens >= 90 + 64
    assert cached == fresh, "rows served by the prefix cache changed a chunked prompt's text"


@pytest.mark.parametrize("pieces, whole, chunked", [(100.0, 100.0, True), (75.0, 100.0, True), (50.0, 100.0, False)])
def test_auto_prefills_in_pieces_only_where_pieces_are_nearly_as_fast(pieces, whole, chunked, target, monkeypatch):
    """Where whole prompts prefill much faster than pieces (torch's matmuls on matrix units the kernel does not
    use), auto keeps whole prompts; a number forces pieces, 0 forbids them, whatever the rates."""
    import augury.costs

    monkeypatch.setattr(augury.costs, "prefill_rates", lambda model: (pieces, whole))
    assert Scheduler(target, None, SchedulerConfig(prefill_chunk=None)).chunked is chunked
    assert Scheduler(target, None, SchedulerConfig(prefill_chunk=8)).chunked
    assert not Scheduler(target, None, SchedulerConfig(prefill_chunk=0)).chunked
    params = SamplingParams(max_tokens=4)
    scheduler = Scheduler(target, None, SchedulerConfig(max_batch=2, prefill_chunk=None))
    run_scheduler(scheduler, [(tokens(20, seed=1), params), (tokens(9, seed=2), params)])
    assert scheduler.stats.prompts_in_pieces == (2 if chunked else 0)


def test_prefill_rates_are_measured_once_and_kept(tmp_path, monkeypatch):
    """The real measurement on the tiny model: two positive rates, read back from the file the second time."""
    import augury.costs
    from augury.costs import costs_path

    monkeypatch.undo()  # the real prefill_rates
    model = native_model("qwen2", seed=5)
    source = tmp_path / "model.gguf"
    source.write_bytes(b"")
    model = type(model)(name=model.name, decoder=model.decoder, tokenizer=model.tokenizer, source=source)
    monkeypatch.setenv("AUGURY_HOME", str(tmp_path / "home"))
    pieces, whole = augury.costs.prefill_rates(model)
    assert pieces > 0 and whole > 0
    kept = costs_path(model).with_name(costs_path(model).name.replace("costs-", "prefill-"))
    assert kept.exists()
    calls = []
    monkeypatch.setattr(model.decoder, "forward", lambda *a, **k: calls.append(a))
    assert augury.costs.prefill_rates(model) == (pieces, whole) and not calls, "measured again"
