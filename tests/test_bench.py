"""`augury bench`: suites, summary arithmetic, interleaving, resume, report files, peers, endpoint, bad input.

Runs use fake contenders (exact, hand-set timings) where the arithmetic is
under test, and tiny random models (tests/tiny.py) end to end.
"""

from __future__ import annotations

import json
import re
from functools import partial
from pathlib import Path

import pytest
import torch

from augury.bench.records import RECORDS, Outcome, read_records, record_for
from augury.bench.report import write_report
from augury.bench.runner import BenchPlan, EngineContender, encode_messages, prepare_run, run_bench, schedule
from augury.bench.suites import Prompt, load_suite
from augury.bench.summary import OVERALL, first_difference, summarize
from augury.cli import main
from augury.commands.bench import run_and_report
from augury.errors import AuguryError
from augury.metrics import SpecStats
from augury.proposers.draft_model import DraftModelProposer
from augury.sampling import SamplingParams
from tests.fake_openai import fake_openai
from tests.tiny import CharTokenizer, decoder_from_hf, hf_model, save_hf, tiny_model

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- helpers ----------------------------------------------------------------------------


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


class FakeContender:
    """Returns a fixed output; logs every call so tests can see order and arguments."""

    kind = "augury"
    lossless = True
    counterpart = None

    def __init__(self, method: str, k: int = 0, log: list | None = None, output=(1, 2, 3), interrupt_at=None):
        self.method, self.k = method, k
        self.log = log if log is not None else []
        self.output = list(output)
        self.interrupt_at = interrupt_at
        self.calls = 0

    def generate(self, messages, prompt_ids, params):
        self.calls += 1
        if self.interrupt_at is not None and self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        self.log.append((self.method, messages[-1]["content"], params.max_tokens, len(messages)))
        tokens = self.output[: params.max_tokens]
        stats = SpecStats(prompt_tokens=len(prompt_ids or []), generated_tokens=len(tokens), prefill_s=0.5, total_s=1.5)
        return Outcome(tokens, f"answer-{self.method}", stats, "length")


def plan_for(prompts, contenders, max_tokens=16, encode=None, **kw) -> BenchPlan:
    return BenchPlan(
        prompts=prompts,
        contenders=contenders,
        params=SamplingParams(max_tokens=max_tokens),
        encode=encode if encode is not None else (lambda messages: [1, 2, 3]),
        settings={"model": "fake", "suite": "test"},
        **kw,
    )


def prompts_n(n: int, tasks=("a", "b")) -> list[Prompt]:
    return [Prompt(str(i), tasks[i % len(tasks)], tasks[i % len(tasks)], (f"q{i}",)) for i in range(n)]


def hand_record(pid, task, method, k, tokens, seconds, steps=(), prefill=0.1, token_ids=None):
    """A record as the runner writes it, from explicit verification steps [(drafted, accepted)]."""
    stats = SpecStats(generated_tokens=tokens, prefill_s=prefill, total_s=prefill + seconds)
    for drafted, accepted in steps:
        stats.record_step(drafted, accepted)
    contender = FakeContender(method, k)
    outcome = Outcome(token_ids if token_ids is not None else list(range(tokens)), "", stats)
    return record_for(Prompt(pid, task, task, ("q",)), contender, [outcome])


def run_info(methods, prompts, temperature=0.0):
    return {
        "suite": "test",
        "temperature": temperature,
        "methods": [{"method": m, "k": k, "kind": "augury", "lossless": True, "counterpart": None} for m, k in methods],
        "prompts": prompts,
        "expected_runs": len(methods) * len(prompts),
    }


# -- suites -----------------------------------------------------------------------------


def test_spec_bench_subset_takes_first_n_per_task_by_question_id(tmp_path):
    rows = [
        {"question_id": 82, "category": "roleplay", "turns": ["r1", "r2"]},
        {"question_id": 81, "category": "writing", "turns": ["w1", "w2"]},
        {"question_id": 83, "category": "writing", "turns": ["w3"]},
        {"question_id": 163, "category": "translation", "turns": ["t3"]},
        {"question_id": 161, "category": "translation", "turns": ["t1"]},
        {"question_id": 162, "category": "translation", "turns": ["t2"]},
    ]
    data = write_jsonl(tmp_path / "question.jsonl", rows)
    suite = load_suite("spec-bench:2", data)
    # MT-Bench categories fold into Spec-Bench's one conversation task.
    assert [(p.id, p.task, p.category) for p in suite.prompts] == [
        ("81", "mt_bench", "writing"), ("82", "mt_bench", "roleplay"),
        ("161", "translation", "translation"), ("162", "translation", "translation"),
    ]
    assert suite.prompts[0].turns == ("w1", "w2")
    assert len(load_suite("spec-bench", data).prompts) == 6
    # mt-bench keeps the fine categories as tasks
    assert load_suite("mt-bench:1", data).tasks == ["roleplay", "writing", "translation"]


def test_named_suite_default_path_is_relative_to_cwd(tmp_path):
    project = tmp_path / "main"
    project.mkdir()
    data = tmp_path / "shared" / "data" / "gsm8k"
    data.mkdir(parents=True)
    write_jsonl(data / "test.jsonl", [{"question": "2+2?", "answer": "4"}, {"question": "3+3?", "answer": "6"}])
    suite = load_suite("gsm8k:1", cwd=project)
    assert [(p.task, p.turns) for p in suite.prompts] == [("gsm8k", ("2+2?",))]


def test_any_jsonl_with_prompt_field(tmp_path):
    rows = [{"prompt": "hello"}, "", {"id": "x", "prompt": "bye", "category": "c"}]
    path = write_jsonl(tmp_path / "mine.jsonl", rows)
    suite = load_suite(str(path))
    assert [(p.id, p.task, p.turns) for p in suite.prompts] == [("1", "mine", ("hello",)), ("x", "c", ("bye",))]


@pytest.mark.parametrize(
    "spec, rows, message",
    [
        ("nonsense-suite", None, "unknown suite 'nonsense-suite'"),
        ("bad.jsonl", ['{"prompt": "a"}', '{"prompt": "b"}', '{"prompt": '], "bad.jsonl:3: malformed JSON"),
        ("bad.jsonl", ['{"prompt": "a"}', '{"text": "b"}'], "bad.jsonl:2: no prompt text"),
        ("bad.jsonl", ['{"turns": []}'], "bad.jsonl:1: field 'turns'"),
        ("bad.jsonl", ["", ""], "no prompts"),
        ("missing.jsonl", None, "suite file not found"),
    ],
)
def test_bad_suites_are_named(tmp_path, spec, rows, message):
    if rows is not None:
        (tmp_path / spec).write_text("\n".join(rows))
    with pytest.raises(AuguryError, match=message):
        load_suite(spec, cwd=tmp_path)


def test_missing_named_suite_data(tmp_path):
    with pytest.raises(AuguryError, match="spec-bench data not found at .*give --data"):
        load_suite("spec-bench:2", cwd=tmp_path)
    with pytest.raises(AuguryError, match="spec-bench data not found at /nope.jsonl"):
        load_suite("spec-bench", "/nope.jsonl")


# -- summary arithmetic -----------------------------------------------------------------


def test_summary_numbers_from_hand_made_records():
    records = [
        hand_record("1", "a", "plain", 0, tokens=10, seconds=2.0, steps=[(0, 0)] * 9),
        hand_record("2", "b", "plain", 0, tokens=30, seconds=2.0, steps=[(0, 0)] * 29),
        # K=4: steps accept 2 then 4 (all) -> committed 3 + 5 = 8 over 2 forwards: τ counts the last token.
        hand_record("1", "a", "model", 4, tokens=10, seconds=1.0, steps=[(4, 2), (4, 4)]),
        hand_record("2", "b", "model", 4, tokens=30, seconds=3.0, steps=[(4, 0), (3, 3)]),
        # a prompt plain never finished: counted in tokens/s, left out of the speed-up
        hand_record("3", "b", "model", 4, tokens=100, seconds=1.0, steps=[(4, 1)]),
    ]
    s = summarize(records, run_info([("plain", 0), ("model", 4)], ["1", "2", "3"]))
    model, plain = ("model", 4), ("plain", 0)

    a = s.cell("a", model)
    assert a.tau == pytest.approx((3 + 5) / 2)
    assert a.alpha == pytest.approx(6 / 8)
    assert a.acceptance_by_position == pytest.approx([1.0, 1.0, 0.5, 0.5])
    assert a.speedup == pytest.approx((10 / 1.0) / (10 / 2.0))

    # task b: speed-up only over prompt 2 (the one both ran): (30/3) / (30/2)
    b = s.cell("b", model)
    assert b.tokens_per_s == pytest.approx(130 / 4.0)
    assert b.speedup == pytest.approx((30 / 3.0) / (30 / 2.0))

    # overall is a ratio of sums over the common prompts, not the mean of task speed-ups
    overall = s.cell(OVERALL, model)
    assert overall.speedup == pytest.approx((40 / 4.0) / (40 / 4.0))
    assert overall.speedup != pytest.approx((a.speedup + b.speedup) / 2)
    assert overall.tau == pytest.approx((3 + 5 + 1 + 4 + 2) / 5)
    assert overall.alpha == pytest.approx((2 + 4 + 0 + 3 + 1) / (4 + 4 + 4 + 3 + 4))
    assert overall.acceptance_by_position == pytest.approx([4 / 5, 3 / 5, 2 / 5, 1 / 4])
    assert s.cell(OVERALL, plain).tau == 1.0 and s.cell(OVERALL, plain).speedup == 1.0
    assert s.cell(OVERALL, plain).alpha is None
    assert s.cell(OVERALL, model).ttft_s == pytest.approx(0.1)
    # end-to-end speed-up uses whole wall time, prefill included
    assert overall.speedup_e2e == pytest.approx((40 / 4.2) / (40 / 4.2))
    # the slowest prompt against plain: prompt 2 at (30/3) / (30/2) = 0.67x, though overall is 1.00x
    assert overall.slowest == pytest.approx((30 / 3.0) / (30 / 2.0)) and a.slowest == pytest.approx(2.0)
    assert not s.complete and s.status == "INCOMPLETE: 5 of 6 runs"


def test_summary_lists_greedy_mismatches_with_first_position():
    records = [
        hand_record("1", "a", "plain", 0, 5, 1.0, token_ids=[5, 6, 7, 8, 9]),
        hand_record("1", "a", "model", 4, 5, 1.0, token_ids=[5, 6, 7, 1, 9]),
        hand_record("2", "a", "plain", 0, 3, 1.0, token_ids=[1, 2, 3]),
        hand_record("2", "a", "model", 4, 3, 1.0, token_ids=[1, 2, 3]),
    ]
    s = summarize(records, run_info([("plain", 0), ("model", 4)], ["1", "2"]))
    assert s.compared[("model", 4)] == (1, 2)
    [m] = s.mismatches
    assert (m.prompt_id, m.method, m.position, m.token, m.plain_token) == ("1", "model", 3, 1, 8)
    # sampled runs by rejection are not compared; coupled ones are (the same seed gives plain's tokens)
    sampled = run_info([("plain", 0), ("model", 4)], ["1", "2"], temperature=0.7)
    assert summarize(records, {**sampled, "sampling": "rejection"}).mismatches == []
    assert len(summarize(records, {**sampled, "sampling": "coupled"}).mismatches) == 1


def test_each_weight_format_is_compared_with_plain_decoding_on_the_same_weights():
    """plain (gguf) and plain@bf16 round differently; model@bf16 must equal plain@bf16, not plain."""
    records = [
        hand_record("1", "a", "plain", 0, 3, 1.0, token_ids=[1, 2, 3]),
        hand_record("1", "a", "model", 4, 3, 1.0, token_ids=[1, 2, 3]),
        hand_record("1", "a", "plain@bf16", 0, 3, 1.0, token_ids=[1, 2, 4]),
        hand_record("1", "a", "model@bf16", 4, 3, 1.0, token_ids=[1, 2, 4]),
    ]
    keys = [("plain", 0), ("model", 4), ("plain@bf16", 0), ("model@bf16", 4)]
    s = summarize(records, run_info(keys, ["1"]))
    assert s.compared[("model", 4)] == (1, 1)
    assert s.compared[("model@bf16", 4)] == (1, 1)
    assert s.compared[("plain@bf16", 0)] == (0, 1)  # against plain on the default weights: a difference shown
    assert s.cell("a", ("plain@bf16", 0)).speedup == 1.0  # speed is still relative to the one plain


def test_methods_may_name_a_weight_format():
    from augury.commands.bench import parse_methods

    assert parse_methods("plain,model@bf16,plain@gguf") == ["plain", "model@bf16", "plain@gguf"]
    with pytest.raises(AuguryError, match="unknown weights 'int3' in 'plain@int3'"):
        parse_methods("plain@int3")


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_peer_ratios_use_counterpart_and_fastest():
    records = [
        hand_record("1", "a", "plain", 0, 10, 2.0),
        hand_record("1", "a", "ngram", 4, 10, 1.0),
        hand_record("1", "a", "hf", 0, 10, 4.0),
    ]
    info = run_info([("plain", 0), ("ngram", 4)], ["1"])
    info["methods"].append({"method": "hf", "k": 0, "kind": "peer", "lossless": False, "counterpart": "plain"})
    [peer] = summarize(records, info).peers
    assert (peer.peer, peer.counterpart, peer.best) == ("hf", "plain", "ngram")
    assert peer.counterpart_ratio == pytest.approx(5.0 / 2.5)
    assert peer.counterpart_ratio_e2e == pytest.approx((10 / 2.1) / (10 / 4.1))
    assert peer.best_ratio == pytest.approx(10.0 / 2.5)


# -- running: interleaving, warm-up, turns, resume ------------------------------------------


def test_schedule_rotates_method_order_per_prompt():
    prompts = prompts_n(4)
    order = [(p.id, c) for p, c in schedule(prompts, ["x", "y", "z"])]
    assert order == [
        ("0", "x"), ("0", "y"), ("0", "z"),
        ("1", "y"), ("1", "z"), ("1", "x"),
        ("2", "z"), ("2", "x"), ("2", "y"),
        ("3", "x"), ("3", "y"), ("3", "z"),
    ]


def test_run_interleaves_prompt_by_prompt_after_unrecorded_warmup(tmp_path):
    log: list = []
    contenders = [FakeContender("plain", 0, log), FakeContender("model", 4, log)]
    run_and_report(plan_for(prompts_n(3), contenders), tmp_path / "out", progress=False)
    warmup, runs = log[:2], log[2:]
    assert all(max_tokens == 8 for _, _, max_tokens, _ in warmup)
    assert [(m, q) for m, q, _, _ in runs] == [
        ("plain", "q0"), ("model", "q0"), ("model", "q1"), ("plain", "q1"), ("plain", "q2"), ("model", "q2"),
    ]
    records = read_records(tmp_path / "out" / RECORDS)
    assert [(r["prompt_id"], r["method"], r["k"]) for r in records] == [
        ("0", "plain", 0), ("0", "model", 4), ("1", "model", 4),
        ("1", "plain", 0), ("2", "plain", 0), ("2", "model", 4),
    ]
    assert records[1]["tokens"] == 3 and records[1]["seconds"] == pytest.approx(1.0)


def test_all_turns_feed_back_each_methods_own_answer(tmp_path):
    log: list = []
    prompt = Prompt("1", "t", "t", ("first", "second"))
    plan, out = plan_for([prompt], [FakeContender("plain", 0, log)], all_turns=True), tmp_path / "o"
    run_bench(plan, out, prepare_run(plan, out), progress=False, warmup=False)
    assert [(q, n) for _, q, _, n in log] == [("first", 1), ("second", 3)]
    [record] = read_records(tmp_path / "o" / RECORDS)
    assert record["turns"] == 2 and record["tokens"] == 6 and len(record["token_ids"]) == 2


def test_resume_after_prompt_limit_completes_without_rerunning(tmp_path):
    out = tmp_path / "out"
    log: list = []
    contenders = [FakeContender("plain", 0, log), FakeContender("model", 4, log)]
    plan = plan_for(prompts_n(3), contenders)
    assert run_and_report(plan, out, max_prompts=1, progress=False, warmup=False) == 2
    summary_md = (out / "summary.md").read_text()
    assert "INCOMPLETE: 2 of 6 runs" in summary_md
    assert "INCOMPLETE: 2 of 6 runs" in (out / "report.html").read_text()
    first = (out / RECORDS).read_text()

    with pytest.raises(AuguryError, match="--resume"):
        run_and_report(plan, out, progress=False, warmup=False)
    log.clear()
    assert run_and_report(plan, out, resume=True, progress=False, warmup=False) == 4
    assert {q for _, q, _, _ in log} == {"q1", "q2"}
    text = (out / RECORDS).read_text()
    assert text.startswith(first)
    keys = [(r["prompt_id"], r["method"]) for r in read_records(out / RECORDS)]
    assert len(keys) == len(set(keys)) == 6
    assert "INCOMPLETE" not in (out / "summary.md").read_text()


def test_ctrl_c_keeps_finished_records_and_marks_report(tmp_path):
    out = tmp_path / "out"
    contenders = [FakeContender("plain", 0), FakeContender("model", 4, interrupt_at=2)]
    plan = plan_for(prompts_n(2), contenders)
    with pytest.raises(KeyboardInterrupt):
        run_and_report(plan, out, progress=False, warmup=False)
    assert len(read_records(out / RECORDS)) == 2  # plain q0, model q0; model's q1 was interrupted
    assert "INCOMPLETE: 2 of 4 runs" in (out / "summary.md").read_text()
    # a torn last line (killed mid-write) is dropped on resume
    with (out / RECORDS).open("a") as fh:
        fh.write('{"prompt_id": "1", "meth')
    contenders[1].interrupt_at = None
    assert run_and_report(plan, out, resume=True, progress=False, warmup=False) == 2
    assert len(read_records(out / RECORDS)) == 4


def test_resume_refuses_different_settings(tmp_path):
    out = tmp_path / "out"
    plan = plan_for(prompts_n(1), [FakeContender("plain")])
    run_bench(plan, out, prepare_run(plan, out), progress=False, warmup=False)
    with pytest.raises(AuguryError, match="different max_new_tokens"):
        prepare_run(plan_for(prompts_n(1), [FakeContender("plain")], max_tokens=99), out, resume=True)


# -- end to end on tiny models: records, correctness, report files -----------------------------


@pytest.fixture
def tiny_suite(tmp_path) -> list[Prompt]:
    rows = [{"question_id": i, "category": c, "turns": [t]} for i, (c, t) in
            enumerate([("x", "abcab"), ("x", "bbcaa"), ("y", "hgfab"), ("y", "cabba")])]
    return load_suite(str(write_jsonl(tmp_path / "tiny.jsonl", rows))).prompts


def test_end_to_end_tiny_models_report(tmp_path, tiny_suite):
    import matplotlib.image

    target, draft = tiny_model(seed=0), tiny_model(seed=1)
    contenders = [EngineContender(target, None, "plain", 0)] + [
        EngineContender(target, DraftModelProposer(draft, 8), "model", k) for k in (1, 3)
    ]
    encode = partial(encode_messages, target.tokenizer, chat=False)
    out = tmp_path / "out"
    settings = {"model": "tiny", "suite": "tiny"}
    plan = BenchPlan(tiny_suite, contenders, SamplingParams(max_tokens=12), encode, settings=settings)
    assert run_and_report(plan, out, progress=False) == 12

    records = read_records(out / RECORDS)
    assert len(records) == 12 and all(r["tokens"] == 12 for r in records)
    model = next(r for r in records if r["method"] == "model" and r["k"] == 3)
    assert set(model) >= {"prompt_id", "task", "category", "method", "k", "tokens", "seconds", "tokens_per_s", "tau",
                          "alpha", "acceptance_by_position", "draft_s", "verify_s", "other_s", "token_ids", "text"}
    assert model["text"][0] == target.tokenizer.decode(model["token_ids"][0])

    s = summarize(records, json.loads((out / "run.json").read_text()))
    assert s.complete and s.mismatches == []
    assert s.compared[("model", 3)] == (4, 4)  # lossless: greedy output identical to plain's
    assert [k for k, *_ in s.sweep["model"]] == [1, 3]

    md = (out / "summary.md").read_text()
    for task in ("x", "y", "overall"):
        for label in ("plain", "model k=1", "model k=3"):
            assert f"| {task} | {label} |" in md
    assert "| model k=3 | augury |" in md and "4/4" in md
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["acceptance.png", "speedup.png", "sweep.png", "time_split.png"]
    for name in pngs:
        assert (out / name).read_bytes()[:8] == PNG_MAGIC
        assert matplotlib.image.imread(out / name).ndim == 3
    html = (out / "report.html").read_text()
    assert html.count('src="data:image/png;base64,iVBORw0KGgo') == 4
    assert "<td>model k=3</td>" in html and "INCOMPLETE" not in html


def test_rebuilt_report_is_stable(tmp_path):
    out = tmp_path / "out"
    run_and_report(plan_for(prompts_n(2), [FakeContender("plain"), FakeContender("ngram", 4)]), out, progress=False)
    before = (out / "summary.md").read_text()
    write_report(out)
    assert (out / "summary.md").read_text() == before


# -- peers ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_hf_peer_runs_on_augurys_own_tensors(tmp_path, arch):
    from augury.bench.peers import hf_model_from
    from augury.models.loader import Model

    reference = hf_model(arch, vocab=64)
    decoder = decoder_from_hf(save_hf(reference, tmp_path / arch))
    model = Model("tiny", decoder, CharTokenizer(64), tmp_path)
    peer = hf_model_from(model)
    ids = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(peer(ids).logits, reference(ids).logits)
    # the big matrices are shared with augury, not copied
    assert peer.model.layers[0].self_attn.q_proj.weight.data_ptr() == decoder.weights.layers[0].wqkv.data_ptr()


def test_hf_peers_greedy_match_augury_plain(tmp_path):
    from augury.bench.peers import build_peers
    from augury.models.loader import Model

    decoder = decoder_from_hf(save_hf(hf_model("qwen2", vocab=64), tmp_path / "t"))
    target = Model("tiny", decoder, CharTokenizer(64), tmp_path)
    draft_decoder = decoder_from_hf(save_hf(hf_model("qwen2", vocab=64, seed=1), tmp_path / "d"))
    draft = Model("tiny-draft", draft_decoder, CharTokenizer(64), tmp_path)
    notes: list[str] = []
    peers = build_peers(["hf", "hf-assisted", "hf-lookup"], target, draft, k=3, n_ctx=256, notes=notes)
    params = SamplingParams(max_tokens=10)
    ids = target.tokenizer.encode("abcabcabcab")
    plain = EngineContender(target, None, "plain", 0).generate([], ids, params)
    for peer in peers:
        outcome = peer.generate([], ids, params)
        assert outcome.token_ids == plain.token_ids, peer.method
        assert outcome.stats.generated_tokens == 10 and 0 < outcome.stats.prefill_s < outcome.stats.total_s


# -- endpoint ------------------------------------------------------------------------------------


def test_endpoint_run_measures_streamed_tokens(tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "hi"}, {"prompt": "there"}])
    out = tmp_path / "out"
    bodies: list = []
    usage = {"usage": {"completion_tokens": 3, "prompt_tokens": 7}}
    with fake_openai({"data": [{"id": "served-x"}]}, usage, bodies) as base:
        code = main(["bench", "--endpoint", base, "--suite", str(data), "--out", str(out), "--no-progress"])
    assert code == 0
    assert all(b["stream"] and b["model"] == "served-x" for b in bodies) and len(bodies) == 3  # warm-up, 2 prompts
    records = read_records(out / RECORDS)
    assert [(r["method"], r["tokens"], r["text"]) for r in records] == [("endpoint", 3, ["one two three"])] * 2
    assert 0 < records[0]["prefill_s"] <= records[0]["total_s"]
    assert "| endpoint | endpoint |" in (out / "summary.md").read_text()


# -- bad input through the CLI: one line, exit 2, no report ---------------------------------------


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--methods", "plain,telepathy"], "unknown method 'telepathy'"),
        (["--suite", "no-such-suite"], "unknown suite 'no-such-suite'"),
        (["--suite", "spec-bench:2", "--data", "/does/not/exist.jsonl"], "spec-bench data not found"),
        (["--suite", "BAD"], "bad.jsonl:2: malformed JSON"),
        (["--endpoint", "http://127.0.0.1:9"], "cannot reach endpoint http://127.0.0.1:9/v1"),
        (["--peers", "vllm"], "unknown peer 'vllm'"),
        (["--sweep-k", "2,0"], "k \\(draft length\\) must be between"),
    ],
)
def test_bad_input_exits_2_without_report(tmp_path, capsys, argv, message):
    bad = write_jsonl(tmp_path / "bad.jsonl", ['{"prompt": "a"}', "{not json"])
    good = write_jsonl(tmp_path / "good.jsonl", [{"prompt": "a"}])
    argv = [str(bad) if a == "BAD" else a for a in argv]
    if "--suite" not in argv:
        argv += ["--suite", str(good)]
    out = tmp_path / "out"
    assert main(["bench", *argv, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("augury: error:"), err
    assert re.search(message, err[0]), err[0]
    assert not out.exists() or not any(out.iterdir())


def test_existing_run_is_not_overwritten(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / RECORDS).write_text("{}\n")
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}])
    assert main(["bench", "--suite", str(data), "--out", str(out)]) == 2
    assert "already holds a benchmark run" in capsys.readouterr().err
    assert (out / RECORDS).read_text() == "{}\n"


# -- the real CLI on the real models (seconds) -----------------------------------------------------


@pytest.mark.real
def test_cli_on_real_models(tmp_path):
    data = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "Say hi.", "category": "chat"}])
    out = tmp_path / "out"
    code = main(["bench", "--methods", "plain,ngram", "--suite", str(data), "--max-tokens", "4",
                 "--out", str(out), "--no-progress", "--no-warmup", "--offline"])
    assert code == 0
    s = summarize(read_records(out / RECORDS), json.loads((out / "run.json").read_text()))
    assert s.complete and {k[0] for k in s.keys} == {"plain", "ngram"}
    assert s.compared[("ngram", 4)] == (1, 1)
    assert all(r["tokens"] > 0 for r in read_records(out / RECORDS))
