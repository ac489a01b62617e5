"""`augury loadtest`: the measuring client against in-process tiny servers, the report's arithmetic,
mismatch detection, and the server-process handling (start failures, ports, the CLI's input checks).

The command itself starts real servers as subprocesses; here the client side
runs against the in-process server of tests/test_server.py instead, whose
greedy outputs are known from `Engine.generate`.
"""

from __future__ import annotations

import socket
import sys

import pytest

from augury.bench.endpoint import EndpointContender
from augury.bench.load import parse_concurrency, prompt_index, prompts_at, rounds_at, run_load
from augury.bench.load_report import SPEC_OFF, SPEC_ON, LevelResult, LoadReport, RequestResult
from augury.bench.server_process import ServerMemory, ServerProcess, check_port_free, resident_gb
from augury.cli import main
from augury.errors import AuguryError
from augury.sampling import SamplingParams
from tests.test_server import VOCAB, encode, serve, tiny_pair

PROMPTS = ["the quick brown fox", "alpha beta", "code river stone", "sky 42"]
MAX_TOKENS = 6


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def engine_output(text: str) -> tuple[str, int]:
    """Text and token count of a prompt alone through the engine, as the server templates it."""
    from augury.engine import Engine
    from augury.proposers.draft_model import DraftModelProposer
    from tests.test_server import ChatCharTokenizer

    target, draft = tiny_pair()
    ids = encode(ChatCharTokenizer(VOCAB).apply_chat_template(chat(text)))
    result = Engine(target, DraftModelProposer(draft, VOCAB), k=4).generate(ids, SamplingParams(max_tokens=MAX_TOKENS))
    return result.text, len(result.token_ids)


@pytest.fixture(scope="module")
def two_servers():
    with serve(max_batch=4) as (base_off, _, _), serve(max_batch=4, k=2) as (base_on, _, _):
        yield base_off, base_on


def clients(bases) -> dict[str, EndpointContender]:
    made = {SPEC_OFF: EndpointContender(bases[0]), SPEC_ON: EndpointContender(bases[1])}
    for client in made.values():
        client.check()
    return made


# -- input ------------------------------------------------------------------------------------------


def test_parse_concurrency():
    assert parse_concurrency("1,2,4,8,16") == [1, 2, 4, 8, 16]
    assert parse_concurrency(" 4, 1 ") == [4, 1]
    for bad in ("", "1,,2", "1,x", "0,1", "-1", "1.5", "2,2"):
        with pytest.raises(AuguryError, match="--concurrency"):
            parse_concurrency(bad)


def test_prompts_go_round_robin_over_clients():
    # 3 clients, 2 rounds, 4 prompts: round 0 asks 0 1 2, round 1 asks 3 0 1.
    assert [[prompt_index(w, r, 3, 4) for w in range(3)] for r in range(2)] == [[0, 1, 2], [3, 0, 1]]
    assert prompts_at(1, 2, 4) == {0, 1}
    assert prompts_at(4, 2, 4) == {0, 1, 2, 3}
    # At least 12 requests per level: one client sends 12, five send 3 each, sixteen their usual 2.
    assert [rounds_at(c, 2, 12) for c in (1, 5, 16)] == [12, 3, 2]
    assert rounds_at(1, 2) == 2


def test_cli_rejects_bad_input_with_one_line(capsys):
    assert main(["loadtest", "--concurrency", "1,two"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("augury: error: --concurrency") and "\n" not in err
    assert main(["loadtest", "--max-tokens", "64", "--seq-tokens", "64"]) == 2
    assert "--seq-tokens" in capsys.readouterr().err


# -- measuring against real (tiny) servers -----------------------------------------------------------


def test_levels_count_tokens_and_equal_the_engine(two_servers):
    expected = {i: engine_output(p) for i, p in enumerate(PROMPTS)}
    report = run_load(clients(two_servers), [chat(p) for p in PROMPTS], [1, 2, 3], 2, MAX_TOKENS)

    assert [(lv.server, lv.concurrency) for lv in report.levels] == [
        (SPEC_OFF, 1), (SPEC_ON, 1), (SPEC_ON, 2), (SPEC_OFF, 2), (SPEC_OFF, 3), (SPEC_ON, 3)
    ]  # the order alternates per level
    for lv in report.levels:
        assert len(lv.requests) == lv.concurrency * 2
        assert sorted(r.prompt for r in lv.requests) == sorted(
            prompt_index(w, r, lv.concurrency, len(PROMPTS)) for w in range(lv.concurrency) for r in range(2))
        for r in lv.requests:
            assert (r.text, r.tokens) == expected[r.prompt]  # usage tokens, and batching changed nothing
            assert 0 < r.ttft_s <= r.total_s
        assert lv.tokens == sum(expected[r.prompt][1] for r in lv.requests)
        assert lv.tok_s == pytest.approx(lv.tokens / lv.wall_s)
        assert lv.wall_s >= max(r.total_s for r in lv.requests)
    # Prompts 2 and 3 are not asked at concurrency 1, so they got a reference request alone.
    assert report.references[SPEC_OFF] == {i: expected[i][0] for i in range(4)}
    assert report.mismatches() == [] and report.lossless_mismatches() == []
    assert report.compared() == 2 * (2 + 4 + 6)
    for c in (1, 2, 3):
        on, off = report.level(SPEC_ON, c), report.level(SPEC_OFF, c)
        assert report.ratio(c) == pytest.approx(on.tok_s / off.tok_s)
        row = next(row for row in report.table().rows if row[0] == str(c))
        assert row[1:4] == [f"{off.tok_s:.1f}", f"{on.tok_s:.1f}", f"{on.tok_s / off.tok_s:.2f}x"]
    assert "all 24 responses equal" in report.markdown()


def test_small_levels_send_more_rounds_to_reach_the_minimum(two_servers):
    report = run_load(clients(two_servers), [chat(p) for p in PROMPTS], [1, 2], 1, MAX_TOKENS, min_requests=3)
    assert [(lv.concurrency, len(lv.requests)) for lv in report.levels] == [(1, 3), (1, 3), (2, 4), (2, 4)]
    assert sorted(r.prompt for r in report.level(SPEC_ON, 1).requests) == [0, 1, 2]
    assert report.mismatches() == [] and report.lossless_mismatches() == []


def test_repeats_turn_the_order_and_sum_into_one_level(two_servers):
    """Two repeats per level run off-on-on-off (then on-off-off-on): drift that is linear over a
    level hits both sides alike. The level's numbers sum its repeats; the table shows their spread."""
    report = run_load(clients(two_servers), [chat(p) for p in PROMPTS], [1, 2], 1, MAX_TOKENS, repeats=2)
    assert [(lv.server, lv.concurrency, lv.repeat) for lv in report.levels] == [
        (SPEC_OFF, 1, 0), (SPEC_ON, 1, 0), (SPEC_ON, 1, 1), (SPEC_OFF, 1, 1),
        (SPEC_ON, 2, 0), (SPEC_OFF, 2, 0), (SPEC_OFF, 2, 1), (SPEC_ON, 2, 1),
    ]
    for c in (1, 2):
        for server in (SPEC_OFF, SPEC_ON):
            runs = report.runs(server, c)
            merged = report.level(server, c)
            assert merged.wall_s == pytest.approx(sum(r.wall_s for r in runs))
            assert len(merged.requests) == 2 * c and merged.tokens == sum(r.tokens for r in runs)
        spread = report.repeat_ratios(c)
        assert len(spread) == 2
        assert min(spread) <= report.ratio(c) <= max(spread)  # the summed ratio lies within the repeats'
        row = next(row for row in report.table().rows if row[0] == str(c))
        assert row[3] == f"{report.ratio(c):.2f}x ({min(spread):.2f}-{max(spread):.2f})"
    assert report.mismatches() == [] and report.lossless_mismatches() == []
    assert report.compared() == 2 * 2 * (1 + 2)


class Tampering(EndpointContender):
    """A client that corrupts the n-th answer to one prompt, as a batching bug would."""

    def __init__(self, base: str, prompt: str, nth: int) -> None:
        super().__init__(base)
        self.prompt, self.nth, self.seen = prompt, nth, 0

    def generate(self, messages, prompt_ids, params):
        outcome = super().generate(messages, prompt_ids, params)
        if messages[0]["content"] == self.prompt:
            self.seen += 1
            if self.seen == self.nth:
                outcome.text = outcome.text[:2] + "#" + outcome.text[3:]
        return outcome


def test_a_changed_answer_is_reported(two_servers):
    made = clients(two_servers)
    made[SPEC_ON] = Tampering(two_servers[1], PROMPTS[1], nth=2)  # 1st: concurrency 1; 2nd: concurrency 2
    made[SPEC_ON].check()
    report = run_load(made, [chat(p) for p in PROMPTS[:2]], [1, 2], 1, MAX_TOKENS)
    found = report.mismatches()
    assert [(m.server, m.concurrency, m.prompt) for m in found] == [(SPEC_ON, 2, 1)]
    assert found[0].got[2] == "#" and found[0].expected == engine_output(PROMPTS[1])[0]
    assert "1 of 6 responses differ" in report.markdown()
    assert "from character 2" in found[0].describe()


# -- the report's arithmetic -------------------------------------------------------------------------


def _level(server: str, c: int, wall: float, texts: list[tuple[int, str, int]]) -> LevelResult:
    return LevelResult(server, c, wall, [RequestResult(p, t, n, 0.5, 0.5 + 0.1 * (n - 1)) for p, t, n in texts])


def test_ratio_goals_and_mismatches_from_known_numbers():
    levels = [
        _level(SPEC_OFF, 1, 2.0, [(0, "abc", 20)]),  # 10 tok/s
        _level(SPEC_ON, 1, 1.0, [(0, "abc", 16)]),  # 16 tok/s: 1.6x
        _level(SPEC_OFF, 8, 1.0, [(0, "abc", 50), (1, "xyz", 50)]),  # 100 tok/s
        _level(SPEC_ON, 8, 1.0, [(0, "abc", 45), (1, "xyZ", 45)]),  # 90 tok/s: 0.9x, and prompt 1 changed
    ]
    report = LoadReport(levels, {SPEC_OFF: {0: "abc", 1: "xyz"}, SPEC_ON: {0: "abc", 1: "xyw"}})
    assert report.ratio(1) == pytest.approx(1.6) and report.ratio(8) == pytest.approx(0.9)
    assert report.table().rows[0] == ["1", "10.0", "16.0", "1.60x", "0.50 / 0.50", "100.0 / 100.0"]
    assert report.goals() == ["goal: at least 1.5x at concurrency 1: met (1.60x)",
                              "goal: never slower than speculation off: missed at concurrency 8 (0.90x)"]
    assert [(m.server, m.concurrency, m.prompt, m.got) for m in report.mismatches()] == [(SPEC_ON, 8, 1, "xyZ")]
    lossless = report.lossless_mismatches()
    assert [(m.prompt, m.expected, m.got) for m in lossless] == [(1, "xyz", "xyw")]
    data = report.to_json()
    assert data["levels"][1]["ratio"] == pytest.approx(0.9)
    assert data["levels"][0][SPEC_ON]["tok_s"] == pytest.approx(16.0)
    assert len(data["mismatches"]) == 1 and len(data["lossless_mismatches"]) == 1


def test_a_slower_level_says_whether_a_repeat_was_not():
    """Two repeats at concurrency 8: off 100 tok/s both times; on 102.0 then 90.9 tok/s. Summed,
    200 tokens in 2.08 s against 2.0 s: 0.96x, slower, but one repeat was not: the note says so.
    At concurrency 16 both repeats are slower: no such note."""
    def at(server, c, wall, repeat):
        level = _level(server, c, wall, [(0, "abc", 100)])
        level.repeat = repeat
        return level

    levels = [at(SPEC_OFF, 8, 1.0, 0), at(SPEC_ON, 8, 0.98, 0), at(SPEC_ON, 8, 1.1, 1), at(SPEC_OFF, 8, 1.0, 1),
              at(SPEC_OFF, 16, 1.0, 0), at(SPEC_ON, 16, 1.05, 0), at(SPEC_ON, 16, 1.1, 1), at(SPEC_OFF, 16, 1.0, 1)]
    report = LoadReport(levels, {})
    assert report.repeat_ratios(8) == pytest.approx([1 / 0.98, 1 / 1.1])
    assert report.ratio(8) == pytest.approx(2.0 / 2.08)
    assert report.goals() == [
        "goal: never slower than speculation off: missed at concurrency "
        "8 (0.96x; repeats 0.909-1.020, one not slower: within this machine's noise), 16 (0.93x)"
    ]


def test_memory_is_read_from_proc_and_reported():
    import mmap
    import os

    before = resident_gb(os.getpid())
    if before is None:
        pytest.skip("no /proc here")
    # A fresh anonymous mapping, every page written: new resident pages for certain. An allocator's buffer
    # (numpy's once) can land on pages the heap already holds from earlier tests and leave RSS unchanged.
    size = 64 * 1024 * 1024
    held = mmap.mmap(-1, size)
    for offset in range(0, size, mmap.PAGESIZE):
        held[offset] = 1
    current, peak = resident_gb(os.getpid())
    assert current >= before[0] + 0.05 and peak >= current
    held.close()
    report = LoadReport([], {}, memory={SPEC_ON: ServerMemory(ready=2.0, peak=2.9, after=2.25)})
    assert "- memory of the spec on server: 2.00 GB resident when ready, peak 2.90 GB, 2.25 GB after the load " \
           "(+0.25 GB)" in report.markdown()
    assert report.to_json()["memory_gb"] == {SPEC_ON: {"ready": 2.0, "peak": 2.9, "after": 2.25}}


# -- server processes --------------------------------------------------------------------------------


def test_a_server_that_dies_is_reported_with_its_stderr():
    script = "import sys; print('loading', file=sys.stderr); print('OSError: no such model', file=sys.stderr); " \
             "sys.exit(3)"
    server = ServerProcess("spec on", [sys.executable, "-c", script], port=1)
    server.start()
    try:
        with pytest.raises(AuguryError, match=r"spec on server exited with code 3 .*loading \| OSError: no such model"):
            server.wait_ready(30)
    finally:
        server.stop()


def test_a_server_that_never_answers_times_out_and_is_stopped():
    server = ServerProcess("spec off", [sys.executable, "-c", "import time; time.sleep(60)"], port=1)
    server.start()
    try:
        with pytest.raises(AuguryError, match=r"did not answer .*/health within 0.5s"):
            server.wait_ready(0.5)
    finally:
        server.stop(grace=5)
    assert server.proc.returncode is not None


def test_a_port_in_use_is_refused():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(AuguryError, match=f"port {s.getsockname()[1]} on 127.0.0.1 is in use"):
            check_port_free(s.getsockname()[1])


# -- another server in the same run (llama-server, vLLM, ...) -----------------------------------------


def test_percentiles_by_nearest_rank_and_the_latency_table():
    from augury.bench.load_report import percentile

    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0 and percentile([3.0, 1.0, 2.0], 99) == 3.0
    assert percentile([float(i) for i in range(1, 101)], 99) == 99.0 and percentile([5.0], 1) == 5.0
    # TTFT 0.5 s each; TPOT 0.1 s for every request with more than one token.
    levels = [_level(SPEC_OFF, 1, 2.0, [(0, "abc", 20)]), _level("llama-server", 1, 1.0, [(0, "abd", 10)]),
              _level("llama-server", 4, 1.0, [(0, "abd", 30), (1, "x", 1)])]
    report = LoadReport(levels, {})
    assert report.servers == [SPEC_OFF, "llama-server"]
    assert report.latency_table().rows == [
        ["spec off", "1", "10.0", "0.50", "0.50", "100.0", "100.0"],
        ["llama-server", "1", "10.0", "0.50", "0.50", "100.0", "100.0"],
        ["llama-server", "4", "31.0", "0.50", "0.50", "100.0", "100.0"],
    ]
    level = report.to_json()["levels"][1]
    assert level["concurrency"] == 4 and level["llama-server"]["tpot_p99_s"] == pytest.approx(0.1)
    assert SPEC_OFF not in level  # spec off ran no concurrency-4 level


def test_an_endpoint_is_loaded_beside_augury_with_its_own_references(two_servers):
    """A third server (here a second tiny augury server standing in for llama-server) gets the same
    levels; its texts are checked against its own concurrency-1 texts, not against augury's."""
    made = clients(two_servers)
    other = EndpointContender(two_servers[1], method="llama-server")
    other.check()
    made["llama-server"] = other
    report = run_load(made, [chat(p) for p in PROMPTS], [1, 2], 1, MAX_TOKENS)
    assert report.servers == [SPEC_OFF, SPEC_ON, "llama-server"]
    assert {lv.server for lv in report.levels if lv.concurrency == 2} == {SPEC_OFF, SPEC_ON, "llama-server"}
    assert report.references["llama-server"] == report.references[SPEC_ON]
    assert not report.mismatches()
    text = report.markdown()
    assert "| llama-server | 2 |" in text and "TPOT p99 (ms)" in text


def test_endpoint_only_starts_no_augury_server_and_reads_the_endpoints_memory(two_servers):
    import os

    from augury.bench.load import run_with_servers

    endpoint = EndpointContender(two_servers[0], method="llama-server")
    endpoint.check()
    report = run_with_servers(["--model", "no-such-model"], [chat(p) for p in PROMPTS[:2]], [1], 1, MAX_TOKENS,
                              endpoints={"llama-server": endpoint}, endpoint_pids={"llama-server": os.getpid()},
                              start_augury=False)
    assert report.servers == ["llama-server"]  # augury's servers would have failed on "no-such-model"
    assert report.memory["llama-server"].ready > 0
    text = report.markdown()
    assert "spec off tok/s" not in text and "memory of the llama-server server" in text


@pytest.mark.parametrize("argv, message", [
    (["--endpoint-only"], "--endpoint-only needs --endpoint"),
    (["--endpoint-pid", "1"], "--endpoint-pid needs --endpoint"),
    (["--endpoint", "http://127.0.0.1:9", "--endpoint-label", "on"], "--endpoint-label"),
    (["--endpoint", "http://127.0.0.1:9", "--endpoint-pid", "999999999"], "--endpoint-pid 999999999: no such process"),
])
def test_cli_rejects_bad_endpoint_options_with_one_line(capsys, argv, message):
    assert main(["loadtest", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("augury: error:") and message in err and "\n" not in err


def test_an_unreachable_endpoint_is_one_line_before_any_server_starts(capsys):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["loadtest", "--endpoint", f"http://127.0.0.1:{port}", "--endpoint-only"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("augury: error:") and "\n" not in err


@pytest.mark.parametrize("flag, value, bad", [("--prefix-cache-gb", "0", "lots"), ("--prefill-chunk", "8", "-2")])
def test_a_server_option_reaches_both_servers_and_a_bad_one_is_one_line(flag, value, bad, capsys):
    import argparse

    from augury.commands import loadtest

    parser = argparse.ArgumentParser()
    loadtest.register(parser.add_subparsers())
    args = parser.parse_args(["loadtest", flag, value])
    argv = loadtest._serve_args(args, max_batch=4)
    assert argv[argv.index(flag) + 1] == value
    assert flag not in loadtest._serve_args(parser.parse_args(["loadtest"]), max_batch=4)
    assert main(["loadtest", flag, bad]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"augury: error: {flag}") and "\n" not in err


# -- multi-turn chats ---------------------------------------------------------------------------------


def test_chats_resend_the_whole_history_every_turn_and_time_each_turn():
    from augury.bench.chats import FOLLOW_UP, fresh, run_chats
    from tests.fake_openai import STREAMED, fake_openai

    bodies: list = []
    usage = {"usage": {"completion_tokens": 3, "prompt_tokens": 7}}
    with fake_openai({"data": [{"id": "m"}]}, usage, bodies) as base:
        client = EndpointContender(base, method="llama-server")
        client.check()
        results = run_chats(client, "llama-server", [chat(p) for p in PROMPTS], turns=3, max_tokens=5, chats=2)
    reply = {"role": "assistant", "content": "".join(STREAMED)}
    follow = {"role": "user", "content": FOLLOW_UP}
    sent = [b["messages"] for b in bodies]
    first = [fresh(chat(PROMPTS[0]), 0), fresh(chat(PROMPTS[1]), 1)]
    again = [fresh(chat(PROMPTS[0]), 0, again=True), fresh(chat(PROMPTS[1]), 1, again=True)]
    assert first[0] == [{"role": "user", "content": "Conversation 1.\n" + PROMPTS[0]}]
    assert again[0] == [{"role": "user", "content": "Conversation 1, once more.\n" + PROMPTS[0]}]
    # each chat's turn 2 is sent once more under its own opening line: the same turn, nothing of it cached
    assert sent == [first[0], first[0] + [reply, follow], first[0] + [reply, follow] * 2, again[0] + [reply, follow],
                    first[1], first[1] + [reply, follow], first[1] + [reply, follow] * 2, again[1] + [reply, follow]]
    assert [(r.server, r.prompt, len(r.ttft_s)) for r in results] == [("llama-server", 0, 3), ("llama-server", 1, 3)]
    assert all(t > 0 for r in results for t in r.ttft_s) and all(r.uncached_second_s > 0 for r in results)


def test_the_second_turn_ratio_table_and_goal_from_known_numbers():
    from augury.bench.chats import ChatResult, chat_goals, chat_table, second_turn_ratio, uncached_ratio

    results = [ChatResult(SPEC_OFF, 0, (2.0, 0.4, 0.5), 0.8), ChatResult(SPEC_OFF, 1, (1.0, 0.1, 0.3), 0.4),
               ChatResult(SPEC_ON, 0, (2.0, 1.0, 1.5))]
    assert second_turn_ratio(results[:2]) == pytest.approx((0.2 + 0.1) / 2)
    assert uncached_ratio(results[:2]) == pytest.approx((0.5 + 0.25) / 2) and uncached_ratio(results[2:]) is None
    table = chat_table(results, {SPEC_OFF: "spec off", SPEC_ON: "spec on"})
    assert table.rows[0] == ["spec off", "2", "1.50", "0.25", "0.40", "0.15x", "0.60", "0.38x"]
    assert table.rows[1] == ["spec on", "1", "2.00", "1.00", "1.50", "0.50x", "—", "—"]
    goals = chat_goals(results, {SPEC_OFF: "spec off", SPEC_ON: "spec on"})
    assert goals == ["goal: a second turn's TTFT at most 0.3x the first's (spec off): met (0.15x)",
                     "goal: a second turn's TTFT at most 0.3x the first's (spec on): missed (0.50x)"]
    report = LoadReport([], {}, chats=results)
    assert "Multi-turn chats" in report.markdown() and report.to_json()["chats"][2]["ttft_s"] == [2.0, 1.0, 1.5]


def test_chat_turns_of_one_is_refused_with_one_line(capsys):
    assert main(["loadtest", "--chat-turns", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("augury: error: --chat-turns") and "\n" not in err


@pytest.mark.parametrize("url, message", [
    ("http://", "names no host"),
    ("http://127.0.0.1:99999", "has a port that is not a number in 1..65535"),
    ("ftp://127.0.0.1", "must start with http:// or https://"),
])
def test_a_malformed_endpoint_url_is_named_for_what_is_wrong_with_it(url, message):
    from augury.bench.endpoint import api_base

    with pytest.raises(AuguryError, match=message):
        api_base(url)
    assert api_base("http://127.0.0.1:8080/v1/chat/completions") == "http://127.0.0.1:8080/v1"


def test_drafting_options_reach_the_spec_on_server_only(capsys):
    """`loadtest --k 3 --draft NAME`: the drafting server gets both; the plain server gets neither, since
    plain decoding refuses drafting options (it exited at start with '--draft is not an option of plain
    decoding')."""
    import argparse

    from augury.bench.server_process import serve_argv
    from augury.commands import loadtest

    parser = argparse.ArgumentParser()
    loadtest.register(parser.add_subparsers())
    args = parser.parse_args(["loadtest", "--model", "no-such-model", "--k", "3", "--draft", "some-drafter"])
    shared, drafting = loadtest._serve_args(args, max_batch=4), loadtest._draft_args(args)
    spec_on = serve_argv(shared, 8001, "model", drafting)
    assert spec_on[spec_on.index("--k") + 1] == "3" and spec_on[spec_on.index("--draft") + 1] == "some-drafter"
    plain = serve_argv(shared, 8000, "plain", drafting)
    assert "--k" not in plain and "--draft" not in plain
    assert main(plain[plain.index("serve"):] + ["--offline"]) == 2  # refused for its model, not its options
    err = capsys.readouterr().err
    assert "no-such-model" in err and "not an option" not in err, err


def test_the_command_runs_end_to_end_against_an_endpoint(tmp_path):
    """`augury loadtest --endpoint URL --endpoint-only` from the command line through the report file: the
    options reach the load run as the runner takes them (a keyword it did not take was a traceback)."""
    import json

    from tests.fake_openai import fake_openai

    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in PROMPTS[:2]))
    out = tmp_path / "load.json"
    usage = {"usage": {"completion_tokens": 3, "prompt_tokens": 7}}
    with fake_openai({"data": [{"id": "m"}]}, usage, []) as base:
        code = main(["loadtest", "--endpoint", base, "--endpoint-only", "--suite", str(suite), "--concurrency", "1,2",
                     "--requests-per-client", "1", "--min-requests", "0", "--max-tokens", "5", "--k", "3",
                     "--out", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    assert report["settings"]["augury_servers"] is False and report["settings"]["k"] == 3
    assert [level["endpoint"]["concurrency"] for level in report["levels"]] == [1, 2], report["levels"]
    assert report["responses_compared"] == 3 and not report["mismatches"]
