"""Collecting a head's training data by prefill: the default corpus (the Python standard library), batched
prefill against each sequence's own forward, the plan checked before any work, the curve of acceptance."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch

from augury.cli import main
from tests.tiny import hf_model, save_hf

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_target(folder: Path) -> Path:
    """A random qwen2 target whose tokenizer reads any text (one token per byte), so it can read the
    standard library; saved as a Hugging Face folder."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": TEMPLATE}))
    save_hf(hf_model("qwen2", seed=1, vocab=len(alphabet) + 2), folder)
    return folder


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return byte_target(tmp_path_factory.mktemp("byte_target"))


def test_stdlib_samples_are_code_and_topics_in_a_seeded_order():
    from augury.train import stdlib_corpus

    first = list(itertools.islice(stdlib_corpus.samples(max_chars=600, seed=0), 400))
    again = list(itertools.islice(stdlib_corpus.samples(max_chars=600, seed=0), 400))
    other = list(itertools.islice(stdlib_corpus.samples(max_chars=600, seed=1), 400))
    assert first == again and [s.source for s in first] != [s.source for s in other]
    code = [s for s in first if not s.source.startswith("pydoc:")]
    assert len(code) > 100 and len({s.source.rsplit(".", 1)[0] for s in code}) > 5, "pieces of several modules"
    for sample in code:
        assert sample.answer.startswith("```python\n") and sample.answer.endswith("\n```")
        assert len(sample.answer) <= 600 + len("```python\n\n```")
        name = sample.source.rsplit(".", 1)[1].split(":")[0]
        assert name in sample.request  # the request names what it asks for
        if ":" in sample.source:  # a long piece goes on: its request quotes the part before's last lines
            assert "```python\n" in sample.request
    assert [m["role"] for m in first[0].messages()] == ["user", "assistant"]


def test_long_pieces_go_on_in_parts_and_the_test_suites_are_a_source_of_their_own():
    from augury.train import stdlib_corpus

    library, suites = set(stdlib_corpus.source_files()), set(stdlib_corpus.source_files(tests=True))
    assert len(library) > 100 and len(suites) > 100 and not library & suites
    assert all(stdlib_corpus.TEST_PARTS & set(p.parts) for p in suites)
    text = "def f():\n" + "".join(f"    x{i} = {i}\n" for i in range(200)) + "    return " + "y" * 700 + "\n"
    parts = stdlib_corpus._parts(text, 300)
    assert "".join(parts) == text and all(len(p) <= 300 for p in parts) and len(parts) > 10
    assert all(p.endswith("\n") for p in parts[:-4])  # cut at line ends, but a 700-character line is cut anyway


def test_the_default_corpus_holds_no_evaluation_text():
    """A sample of the corpus (a few thousand pieces) against every prompt of the evaluation sets."""
    from augury.train import stdlib_corpus

    if not SHARED_DATA.is_dir():
        pytest.skip(f"the evaluation sets are not at {SHARED_DATA}")
    turns = []
    for path in SHARED_DATA.rglob("*.jsonl"):
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            turns += [t for t in record.get("turns", [])] + [record.get("question", "")]
    probes = {" ".join(t.split())[:48] for t in turns if len(" ".join(t.split())) >= 48}
    assert len(probes) > 500, f"only {len(probes)} evaluation prompts found under {SHARED_DATA}"
    text = " ".join(" ".join(f"{s.request} {s.answer}".split())
                    for s in itertools.islice(stdlib_corpus.samples(seed=0), 4000))
    assert len(text) > 1_000_000
    found = [p for p in probes if p in text]
    assert not found, f"evaluation prompts inside the default corpus: {found[:3]}"


def test_batched_prefill_gives_each_sequence_its_own_forward(target_dir, tmp_path):
    """fp32: sequences of different lengths right-padded into one prefill give the states and top-k of each
    sequence's own forward (causal attention never reads the padding after a position)."""
    from augury.models.head import HeadConfig
    from augury.models.loader import load_model
    from augury.train import features

    target = load_model(str(target_dir), dtype="fp32")
    gen = torch.Generator().manual_seed(0)
    lengths = [7, 30, 19, 64, 3, 41]
    sequences = [torch.randint(0, 256, (n,), generator=gen).tolist() for n in lengths]
    config = HeadConfig.for_kind("mtp")  # the last layer's output: the state before the final norm
    shards = {}
    for name, batch_tokens in (("alone", 1), ("batched", 10_000)):
        writer = features.ShardWriter(tmp_path / name)
        (tmp_path / name).mkdir()
        features.collect(target, sequences, config, writer, starts=list(range(len(sequences))), topk=4,
                         batch_tokens=batch_tokens)
        shards[name] = features.load(writer.flush())
    alone, batched = shards["alone"], shards["batched"]
    assert batched.num_sequences == len(sequences)
    assert torch.equal(alone.tokens, batched.tokens) and torch.equal(alone.starts, batched.starts)
    torch.testing.assert_close(batched.states.float(), alone.states.float(), atol=1e-2, rtol=1e-2)  # bf16 on disk
    assert torch.equal(alone.topk_ids[:, 0], batched.topk_ids[:, 0])
    # and both are the decoder's own forward over each sequence, to the bf16 the shards keep
    hidden = target.config.hidden_size
    for s in range(alone.num_sequences):
        lo, hi = alone.span(s)
        ids = alone.tokens[lo:hi].tolist()
        cache = target.decoder.new_cache(1, len(ids) + 8)
        logits, states = target.decoder.forward_states(torch.tensor([ids]), cache,
                                                       states=(target.config.num_layers - 1,))
        assert torch.equal(alone.states[lo:hi], states[0, :, :hidden].to(torch.bfloat16))
        assert torch.equal(alone.topk_ids[lo:hi], logits[0].topk(4, dim=-1).indices)


def test_length_batches_fill_the_token_budget_shortest_first():
    from augury.train.features import length_batches

    lengths = [50, 10, 300, 10, 600, 40]
    batches = length_batches(lengths, 100)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    # 10, 10 (adding 40 would pad to 120), then 40 and 50 padded to 100; long ones alone
    assert batches == [[1, 3], [5, 0], [2], [4]]


def test_train_on_the_default_corpus_records_rates_sources_and_the_curve(target_dir, home, capsys):
    out = home / "head"
    code = main(["train", "--model", str(target_dir), "--kind", "eagle", "--out", str(out), "--hours", "0.1",
                 "--dtype", "fp32", "--corpus-tokens", "6000", "--seq-len", "128", "--max-steps", "40",
                 "--curve-at", "1000,3000", "--draft-vocab", "200", "--holdout", "0.1", "--quiet"])
    assert code == 0, capsys.readouterr().err
    meta = json.loads((out / "head.json").read_text())
    source = meta["data"]["sources"][0]
    assert source["source"] == "stdlib" and "PSF" in source["licence"]
    assert 6000 <= meta["data"]["tokens"] < 6000 + 128 * 8, "collection stops right after --corpus-tokens"
    rates = meta["data"]["tokens_per_hour"]
    assert rates["prefill"] > 0 and rates["stdlib"] > 0
    assert [p["tokens_seen"] >= n for p, n in zip(meta["curve"], (1000, 3000))] == [True, True]
    assert all(len(p["alpha"]) == 4 for p in meta["curve"])
    assert meta["train"]["tokens_seen"] >= meta["curve"][-1]["tokens_seen"] and meta["train"]["tokens_per_second"] > 0
    curve_file = [json.loads(line) for line in (out / "work" / "curve.jsonl").read_text().splitlines()]
    assert curve_file == meta["curve"]


@pytest.mark.parametrize("flags, message", [
    (["--save-dtype", "int3"], "unknown --save-dtype 'int3'"),
    (["--curve-at", "5k"], "--curve-at takes comma-separated token counts"),
    (["--corpus", "wiki"], "unknown corpus source 'wiki'"),
    (["--corpus", "none"], "--corpus none needs --data"),
    (["--dropout", "1.5"], "--dropout must be in [0, 1)"),
    (["--collect-share", "1"], "the corpus share of the budget must be in (0, 1)"),
])
def test_a_bad_plan_is_refused_before_the_target_loads(flags, message, home, capsys):
    """The target named does not exist: a plan checked after loading would report that instead."""
    code = main(["train", "--model", str(home / "no-such-model"), "--kind", "eagle", "--out", str(home / "h"),
                 "--hours", "1", "--offline", *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.slow
def test_the_gpu_recipe_runs_end_to_end_on_a_cpu_and_writes_pieces(target_dir, home):
    """scripts/train-head-gpu.sh with DEVICE=cpu on the tiny target: the same script a GPU runs, so GPU
    minutes go to training, not debugging. Pieces of at most PIECE bytes join back into the head, and the
    default corpus has the target write as well as read."""
    import os
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "train-head-gpu.sh"
    out = home / "gpu-head"
    env = {**os.environ, "DEVICE": "cpu", "DTYPE": "fp32", "TOKENS": "4000", "PIECE": "64k", "BATCH": "4",
           "SEQ_LEN": "128", "PREFILL_TOKENS": "512", "CURVE_AT": "1000,2000",
           "AUGURY": f"{sys.executable} -m augury.cli", "PYTHON": sys.executable,
           "EXTRA": "--max-steps 20 --draft-vocab 200 --holdout 0.1 --request-tokens 32 --answer-tokens 96 --sequences 8"}
    done = subprocess.run(["bash", str(script), str(target_dir), str(out), "1"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    head = (out / "head.safetensors").read_bytes()
    pieces = sorted(out.glob("head.safetensors.part-*"))
    assert len(pieces) >= 2 and all(p.stat().st_size <= 64 * 1024 for p in pieces)
    assert b"".join(p.read_bytes() for p in pieces) == head
    assert "held-out alpha by position" in done.stdout and done.stdout.count("tokens seen: alpha") == 2
    assert "join with: cat head.safetensors.part-*" in done.stdout
    sources = {s["source"] for s in json.loads((out / "head.json").read_text())["data"]["sources"]}
    assert {"self", "stdlib"} <= sources, f"the default mix writes and reads: {sources}"
