"""llama.cpp as a benchmark peer: fake llama.cpp binaries (scripts written here that print llama.cpp's
stdout and stderr formats) prove the command lines, the parsing, the interleaving with augury's methods
and the one-line errors. The real build is never needed here.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from augury.bench.llama_cpp import (
    LlamaCppContender,
    completion_answer,
    parse_completion_timings,
    parse_speculative_timings,
    speculative_answer,
)
from augury.bench.peers import parse_peers
from augury.bench.records import RECORDS, read_records
from augury.cli import main
from augury.errors import AuguryError
from augury.sampling import SamplingParams
from tests.fake_openai import fake_openai

ANSWER = "xyzXYZ!?" * 8  # one token per character in the tiny GGUF's vocabulary
PREFILL_MS, EVAL_MS_PER_RUN, SAMPLING_MS = 200.0, 50.0, 1.5
ENCODE_S, DECODE_S, DRAFTED, ACCEPTED = 0.3, 1.25, 12, 9

# One script plays every llama.cpp binary by the name it is called under. It reads the prompt file the
# way llama.cpp does (dropping one trailing newline), counts one token per character, logs its call,
# and prints what the real binary prints on stdout and stderr.
FAKE = r'''
import json, os, signal, sys
tool = os.path.basename(sys.argv[0])
args = sys.argv[1:]
def opt(flag, default=None):
    return args[args.index(flag) + 1] if flag in args else default
config = json.loads(CONFIG)
if config.get("fail") == tool:
    sys.stderr.write("llama_model_load: error loading model\nmain: error: unable to load model\n")
    sys.exit(1)
if config.get("crash_unless_repack_off") == tool and opt("--repack") != "0":
    os.kill(os.getpid(), signal.SIGILL)  # what llama.cpp's repacked AMX path did on docs/benchmarks.md 31's machine
if tool == "llama-bench":
    rows = [int(r) for r in opt("-p").split(",")]
    for n in rows:
        ns = 1e9 * (0.030 + 0.002 * n)
        print(json.dumps({"n_prompt": n, "n_gen": 0, "n_depth": int(opt("-d", "0")), "avg_ns": ns,
                          "avg_ts": n / (ns / 1e9), "n_threads": int(opt("-t"))}))
    sys.exit(0)
prompt = open(opt("-f"), encoding="utf-8").read()
if prompt.endswith("\n"):
    prompt = prompt[:-1]
n = int(opt("-n"))
with open(config["log"], "a", encoding="utf-8") as log:
    log.write(json.dumps({"tool": tool, "argv": args, "prompt": prompt}) + "\n")
p = len(prompt) + config.get("extra_prompt_tokens", 0)
eos = config.get("eos_after")
if tool == "llama-completion":
    answer = config["answer"][: min(n, eos if eos is not None else n)]
    sys.stdout.write(answer + (" [end of text]\n" if eos is not None and eos < n else "") + "\n\n")
    runs = len(answer) if eos is not None and eos < n else len(answer) - 1
    sys.stderr.write(
        "common_perf_print:    sampling time =       %.2f ms\n"
        "common_perf_print:    samplers time =       0.90 ms /    %d tokens\n"
        "common_perf_print:        load time =     812.00 ms\n"
        "common_perf_print: prompt eval time =     %.2f ms / %5d tokens (    4.00 ms per token,   250.00 tokens/s)\n"
        "common_perf_print:        eval time =     %.2f ms / %5d runs   (   50.00 ms per token,    20.00 tokens/s)\n"
        "common_perf_print:       total time =    1400.00 ms / %5d tokens\n"
        % (config["sampling_ms"], n, config["prefill_ms"], p, config["eval_ms"] * runs, runs, p + runs))
else:
    committed = n + 1 + config.get("overshoot", 0)  # -n + 1 tokens, more when the last block ran past
    answer = config["answer"][:committed]
    sys.stdout.write("\n\n" + prompt + answer + "\n\n" + "\n\n")
    sys.stderr.write(
        "encoded %4d tokens in %8.3f seconds, speed: %8.3f t/s\n"
        "decoded %4d tokens in %8.3f seconds, speed: %8.3f t/s\n\n"
        "n_draft   = %s\nn_predict = %d\nn_drafted = %d\nn_accept  = %d\naccept    = 75.000%%\n"
        % (p, config["encode_s"], p / config["encode_s"], committed, config["decode_s"], committed / config["decode_s"],
           opt("--spec-draft-n-max", opt("--spec-ngram-simple-size-m")), committed, config["drafted"],
           config["accepted"]))
'''
TOOLS = ("llama-completion", "llama-speculative-simple", "llama-bench")


def write_fake_llama_cpp(folder: Path, tools=TOOLS, **config) -> Path:
    """A folder of fake llama.cpp binaries; their calls are logged to folder/calls.jsonl."""
    folder.mkdir(parents=True, exist_ok=True)
    settings = {"log": str(folder / "calls.jsonl"), "answer": ANSWER, "prefill_ms": PREFILL_MS,
                "eval_ms": EVAL_MS_PER_RUN, "sampling_ms": SAMPLING_MS, "encode_s": ENCODE_S,
                "decode_s": DECODE_S, "drafted": DRAFTED, "accepted": ACCEPTED, **config}
    script = f"#!{sys.executable}\nCONFIG = {json.dumps(json.dumps(settings))}\n{FAKE}"
    for tool in tools:
        path = folder / tool
        path.write_text(script)
        path.chmod(0o755)
    return folder


def calls(folder: Path) -> list[dict]:
    path = folder / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> Path:
    from tests.test_loading import write_llama_gguf
    from tests.tiny import hf_model

    return write_llama_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", hf_model("llama"))


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("AUGURY_HOME", str(tmp_path / "home"))


def _suite(tmp_path: Path, prompts: list[str]) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": p, "category": "coding"}) + "\n" for p in prompts))
    return path


def _bench(tmp_path, gguf, llama_dir, prompts, *extra) -> int:
    return main([
        "bench", "--model", str(gguf), "--draft", str(gguf), "--dtype", "fp32", "--methods", "plain",
        "--peers", "llamacpp", "--llama-cpp", str(llama_dir), "--suite", str(_suite(tmp_path, prompts)),
        "--no-chat", "--max-tokens", "6", "--out", str(tmp_path / "out"), "--no-progress", *extra,
    ])


# -- parsing llama.cpp's output ---------------------------------------------------------------


def test_completion_timings_parse_prompt_eval_eval_and_sampling():
    stderr = (
        "llama_perf_context_print: prompt eval time =  1000.00 ms /     1 tokens\n"  # an earlier print
        "common_perf_print:    sampling time =      12.50 ms\n"
        "common_perf_print: prompt eval time =     321.25 ms /   117 tokens (    2.75 ms per token)\n"
        "common_perf_print:        eval time =    4200.00 ms /   127 runs   (   33.07 ms per token)\n"
    )
    t = parse_completion_timings(stderr)
    assert (t.prompt_tokens, t.prefill_s) == (117, pytest.approx(0.32125))
    assert t.decode_s == pytest.approx(4.2125)  # eval, not the prompt's eval, plus sampling
    assert (t.drafted, t.accepted, t.committed) == (0, 0, 0)


def test_speculative_timings_parse_encoded_decoded_and_acceptance():
    stderr = (
        "encoded  117 tokens in    0.402 seconds, speed:  291.045 t/s\n"
        "decoded  128 tokens in    8.500 seconds, speed:   15.059 t/s\n\n"
        "n_draft   = 3\nn_predict = 128\nn_drafted = 141\nn_accept  = 81\naccept    = 57.447%\n"
    )
    t = parse_speculative_timings(stderr)
    assert (t.prompt_tokens, t.prefill_s, t.decode_s) == (117, pytest.approx(0.402), pytest.approx(8.5))
    assert (t.committed, t.drafted, t.accepted) == (128, 141, 81)


@pytest.mark.parametrize("parse, missing", [
    (parse_completion_timings, "eval time"), (parse_speculative_timings, "decoded"),
])
def test_output_without_timings_is_a_clear_error(parse, missing):
    text = "encoded   10 tokens in 0.1 seconds\ncommon_perf_print: prompt eval time = 1.00 ms / 10 tokens\n"
    with pytest.raises(AuguryError, match=f"printed no '{missing}' line"):
        parse(text)


def test_answers_are_cut_out_of_stdout():
    assert completion_answer("def f():\n    return 1\n\n\n") == ("def f():\n    return 1\n", False)
    assert completion_answer("Hello. [end of text]\n\n\n") == ("Hello.", True)
    prompt = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert speculative_answer("\n\n" + prompt + "Hi!\n\n\n\n", prompt) == "Hi!"
    with pytest.raises(AuguryError, match="did not echo the prompt"):
        speculative_answer("\n\nsomething else\n\n", prompt)


def test_peer_groups():
    assert parse_peers("llamacpp") == ["llamacpp", "llamacpp-spec"]
    assert parse_peers("llamacpp-plain,hf,llamacpp-lookup") == ["llamacpp", "hf", "llamacpp-lookup"]


# -- one contender, one fake binary -----------------------------------------------------------


class ChatTokenizer:
    """One token per character, and a chat template with special tokens and a trailing newline."""

    eos_ids = frozenset()

    def apply_chat_template(self, messages):
        body = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return body + "<|im_start|>assistant\n"

    def encode(self, text, *, add_bos=None):
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(map(chr, ids))


def _contender(tmp_path, method, llama_dir, **kw):
    from augury.models.loader import Model

    target = tmp_path / "target.gguf"
    target.write_bytes(b"GGUF")
    draft = tmp_path / "draft.gguf"
    draft.write_bytes(b"GGUF")
    model = Model("t", decoder=None, tokenizer=ChatTokenizer(), source=target)
    binary = llama_dir / ("llama-completion" if method == "llamacpp" else "llama-speculative-simple")
    return LlamaCppContender(method, model, binary, chat=True, n_ctx=4096, threads=3, k=4, draft=draft, **kw)


def test_prompt_file_is_augurys_chat_text_and_timings_are_llama_cpps(tmp_path):
    llama = write_fake_llama_cpp(tmp_path / "bin")
    peer = _contender(tmp_path, "llamacpp", llama)
    messages = [{"role": "user", "content": "Say \\n hi"}]
    text = ChatTokenizer().apply_chat_template(messages)
    outcome = peer.generate(messages, ChatTokenizer().encode(text), SamplingParams(max_tokens=10))
    [call] = calls(llama)
    assert call["prompt"] == text  # the chat template's trailing newline survives llama.cpp's file reading
    argv = call["argv"]
    assert "--no-escape" in argv  # a literal backslash-n in the prompt stays two characters
    assert [argv[argv.index(f) + 1] for f in ("-n", "-t", "-c", "--temp", "--top-k")] == ["10", "3", "4096", "0.0", "0"]
    assert outcome.text == ANSWER[:10] and outcome.token_ids == [ord(c) for c in ANSWER[:10]]
    assert outcome.finish_reason == "length"
    s = outcome.stats
    assert (s.prompt_tokens, s.generated_tokens) == (len(text), 10)
    assert s.prefill_s == pytest.approx(PREFILL_MS / 1e3)
    # 10 tokens: the prompt's forward gave the first, 9 eval runs the rest
    assert s.decode_s == pytest.approx((9 * EVAL_MS_PER_RUN + SAMPLING_MS) / 1e3)


def test_end_of_sequence_is_a_stop(tmp_path):
    llama = write_fake_llama_cpp(tmp_path / "bin", eos_after=4)
    peer = _contender(tmp_path, "llamacpp", llama)
    messages = [{"role": "user", "content": "hi"}]
    ids = ChatTokenizer().encode(ChatTokenizer().apply_chat_template(messages))
    outcome = peer.generate(messages, ids, SamplingParams(max_tokens=10))
    assert (outcome.text, outcome.finish_reason, outcome.stats.generated_tokens) == (ANSWER[:4], "stop", 4)
    assert outcome.stats.decode_s == pytest.approx((4 * EVAL_MS_PER_RUN + SAMPLING_MS) / 1e3)


def test_speculative_peer_runs_the_draft_model_at_k_and_reports_acceptance(tmp_path):
    llama = write_fake_llama_cpp(tmp_path / "bin")
    peer = _contender(tmp_path, "llamacpp-spec", llama)
    messages = [{"role": "user", "content": "hi"}]
    ids = ChatTokenizer().encode(ChatTokenizer().apply_chat_template(messages))
    outcome = peer.generate(messages, ids, SamplingParams(max_tokens=10))
    argv = calls(llama)[0]["argv"]
    assert [argv[argv.index(f) + 1] for f in ("--spec-type", "--spec-draft-n-max", "-md", "-td", "-n")] == [
        "draft-simple", "4", str(tmp_path / "draft.gguf"), "3", "9"]  # -n 9 commits 10
    s = outcome.stats
    assert outcome.text == ANSWER[:10] and s.generated_tokens == 10
    assert (s.prefill_s, s.decode_s) == (pytest.approx(ENCODE_S), pytest.approx(DECODE_S))
    assert (s.drafted, s.accepted, s.alpha) == (DRAFTED, ACCEPTED, pytest.approx(ACCEPTED / DRAFTED))
    assert s.tau == pytest.approx(10 / (10 - ACCEPTED))  # every verification commits accepted + 1


def test_speculative_tokens_past_max_tokens_count_in_the_rate_not_in_the_output(tmp_path):
    llama = write_fake_llama_cpp(tmp_path / "bin", overshoot=3)  # the last block ran 3 tokens past
    peer = _contender(tmp_path, "llamacpp-spec", llama)
    messages = [{"role": "user", "content": "hi"}]
    ids = ChatTokenizer().encode(ChatTokenizer().apply_chat_template(messages))
    outcome = peer.generate(messages, ids, SamplingParams(max_tokens=10))
    assert outcome.text == ANSWER[:10] and len(outcome.token_ids) == 10 and outcome.finish_reason == "length"
    assert outcome.stats.generated_tokens == 13  # llama.cpp decoded 13 tokens in its decode time
    assert outcome.stats.tokens_per_s == pytest.approx(13 / DECODE_S)


def test_lookup_peer_sets_the_ngram_draft_length(tmp_path):
    llama = write_fake_llama_cpp(tmp_path / "bin")
    peer = _contender(tmp_path, "llamacpp-lookup", llama)
    messages = [{"role": "user", "content": "hi"}]
    peer.generate(messages, ChatTokenizer().encode(ChatTokenizer().apply_chat_template(messages)),
                  SamplingParams(max_tokens=5))
    argv = calls(llama)[0]["argv"]
    assert argv[argv.index("--spec-type") + 1] == "ngram-simple" and "-md" not in argv
    assert argv[argv.index("--spec-ngram-simple-size-m") + 1] == "4"


def test_a_different_prompt_tokenization_is_refused(tmp_path):
    llama = write_fake_llama_cpp(tmp_path / "bin", extra_prompt_tokens=1)  # e.g. an added BOS
    peer = _contender(tmp_path, "llamacpp", llama)
    messages = [{"role": "user", "content": "hi"}]
    ids = ChatTokenizer().encode(ChatTokenizer().apply_chat_template(messages))
    with pytest.raises(AuguryError, match=f"read the prompt as {len(ids) + 1} tokens, augury as {len(ids)}"):
        peer.generate(messages, ids, SamplingParams(max_tokens=4))


def test_a_failing_binary_is_one_line(tmp_path):
    llama = write_fake_llama_cpp(tmp_path / "bin", fail="llama-completion")
    peer = _contender(tmp_path, "llamacpp", llama)
    with pytest.raises(AuguryError, match=r"llama-completion failed \(exit 1\): main: error: unable to load model"):
        peer.generate([{"role": "user", "content": "hi"}], [1], SamplingParams(max_tokens=4))


# -- through `augury bench` on a tiny GGUF -------------------------------------------------------


def test_bench_interleaves_llama_cpp_with_augury_prompt_by_prompt(tmp_path, tiny_gguf, home):
    llama = write_fake_llama_cpp(tmp_path / "bin")
    prompts = ["abcabcab", "hello", "qwerty"]
    assert _bench(tmp_path, tiny_gguf, llama, prompts) == 0
    records = read_records(tmp_path / "out" / RECORDS)
    order = [(r["prompt_id"], r["method"]) for r in records]
    methods = ["plain", "llamacpp", "llamacpp-spec"]
    ids = list(dict.fromkeys(r["prompt_id"] for r in records))
    # prompt by prompt, each prompt's group starting one contender later than the last
    assert order == [(pid, m) for i, pid in enumerate(ids) for m in methods[i % 3:] + methods[:i % 3]]
    # llama.cpp saw augury's prompts in the same order, after one warm-up each (8 tokens at most)
    seen = [(c["tool"], c["prompt"]) for c in calls(llama)]
    assert seen[:2] == [("llama-completion", prompts[0]), ("llama-speculative-simple", prompts[0])]
    assert [p for _, p in seen[2:]] == [p for p in prompts for _ in range(2)]
    by = {(r["prompt_id"], r["method"]): r for r in records}
    for pid, prompt in zip(ids, prompts):
        plain, cpp, spec = (by[(pid, m)] for m in methods)
        assert cpp["prompt_tokens"] == spec["prompt_tokens"] == plain["prompt_tokens"] == len(prompt)
        assert cpp["tokens"] == spec["tokens"] == 6 and cpp["text"] == [ANSWER[:6]]
        assert cpp["kind"] == "peer" and spec["k"] == 4 and spec["drafted"] == DRAFTED
        assert cpp["seconds"] == pytest.approx((5 * EVAL_MS_PER_RUN + SAMPLING_MS) / 1e3)
    for call in calls(llama):
        argv = call["argv"]
        assert argv[argv.index("-m") + 1] == str(tiny_gguf) and argv[argv.index("-c") + 1] == "256"
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "| llamacpp | peer |" in summary and "| llamacpp-spec | peer |" in summary
    assert "Acceptance by draft position" not in summary  # llama.cpp reports no per-position counts
    peers_table = summary[summary.index("augury against peers"):]
    # the llamacpp row: decode tok/s (6 tokens over 5 eval runs and sampling), end to end (prefill too), vs plain
    decode_s = (5 * EVAL_MS_PER_RUN + SAMPLING_MS) / 1e3
    row = rf"\| llamacpp \| {6 / decode_s:.2f} \| {6 / (decode_s + PREFILL_MS / 1e3):.2f} \| plain \|"
    assert re.search(row, peers_table), peers_table


@pytest.mark.parametrize("argv, message", [
    ([], "the llamacpp peers need --llama-cpp DIR"),
    (["--llama-cpp", "/no/such/dir"], "--llama-cpp /no/such/dir: no such folder"),
    (["--llama-cpp", "ONLY_COMPLETION"], "holds no executable llama-speculative-simple"),
])
def test_missing_binaries_exit_2_in_one_line_before_loading(tmp_path, capsys, argv, message):
    only = write_fake_llama_cpp(tmp_path / "only", tools=("llama-completion",))
    argv = [str(only) if a == "ONLY_COMPLETION" else a for a in argv]
    data = _suite(tmp_path, ["a"])
    code = main(["bench", "--model", "/no/such/model.gguf", "--methods", "plain", "--peers", "llamacpp",
                 *argv, "--suite", str(data), "--out", str(tmp_path / "out"), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("augury: error:") and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_only_gguf_files_are_run(tmp_path):
    from augury.models.loader import Model

    llama = write_fake_llama_cpp(tmp_path / "bin")
    folder = tmp_path / "hf-model"
    folder.mkdir()
    target = tmp_path / "target.gguf"
    target.write_bytes(b"GGUF")
    for source, draft, message in [
        (folder, None, "need a GGUF target; .*hf-model is not one"),
        (target, None, "need a GGUF draft model; None is not one"),
        (target, folder, "need a GGUF draft model; .*hf-model is not one"),
    ]:
        model = Model("t", decoder=None, tokenizer=ChatTokenizer(), source=source)
        with pytest.raises(AuguryError, match=message):
            LlamaCppContender("llamacpp-spec", model, llama / "llama-speculative-simple", chat=True, n_ctx=64,
                              threads=1, k=2, draft=draft)


# -- `augury bench --endpoint` against llama-server -----------------------------------------------


@pytest.mark.parametrize("server, expect", [
    # llama-server: owned_by llamacpp, OpenAI usage plus its own timings (draft counts when speculating)
    ({"listing": {"object": "list", "data": [{"id": "qwen.gguf", "object": "model", "owned_by": "llamacpp"}]},
      "final": {"usage": {"completion_tokens": 3, "prompt_tokens": 9, "total_tokens": 12},
                "timings": {"prompt_n": 9, "prompt_ms": 40.0, "predicted_n": 3, "predicted_ms": 90.0,
                            "draft_n": 6, "draft_n_accepted": 4}}},
     {"model": "qwen.gguf", "cache_prompt": False, "tokens": 3, "prompt_tokens": 9, "drafted": 6, "accepted": 4}),
    # augury serve: its usage extension
    ({"listing": {"data": [{"id": "augury-model", "owned_by": "augury"}]},
      "final": {"usage": {"completion_tokens": 5, "prompt_tokens": 7,
                          "augury": {"drafted": 8, "accepted": 5, "tau": 2.0}}}},
     {"model": "augury-model", "cache_prompt": None, "tokens": 5, "prompt_tokens": 7, "drafted": 8, "accepted": 5}),
    # a bare server: no usage, no extensions; tokens are the content deltas
    ({"listing": {"data": [{"id": "bare"}]}, "final": {}},
     {"model": "bare", "cache_prompt": None, "tokens": 3, "prompt_tokens": 0, "drafted": 0, "accepted": 0}),
])
def test_endpoint_reads_llama_server_and_tolerates_missing_extensions(tmp_path, server, expect):
    bodies: list = []
    out = tmp_path / "out"
    with fake_openai(server["listing"], server["final"], bodies) as base:
        code = main(["bench", "--endpoint", base, "--suite", str(_suite(tmp_path, ["hi"])), "--out", str(out),
                     "--no-progress"])
    assert code == 0
    [record] = read_records(out / RECORDS)
    assert [b["model"] for b in bodies] == [expect["model"]] * 2  # warm-up and the prompt
    assert all(b.get("cache_prompt") is expect["cache_prompt"] for b in bodies)
    got = {k: record[k] for k in ("tokens", "prompt_tokens", "drafted", "accepted")}
    assert got == {k: expect[k] for k in got}
    assert record["text"] == ["one two three"]


def test_an_error_event_in_the_stream_is_one_line(tmp_path, capsys):
    listing = {"data": [{"id": "qwen.gguf", "owned_by": "llamacpp"}]}
    error = {"error": {"code": 400, "message": "the request exceeds the available context size"}}
    with fake_openai(listing, error) as base:
        code = main(["bench", "--endpoint", base, "--no-warmup", "--suite", str(_suite(tmp_path, ["hi"])),
                     "--out", str(tmp_path / "out"), "--no-progress"])
    assert code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("augury:")]
    assert err[-1].endswith("reported an error: the request exceeds the available context size"), err
