"""`augury train` end to end on a tiny target, resuming, and every bad input it can meet."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from augury.cli import main
from augury.engine import Engine
from augury.errors import AuguryError
from augury.sampling import SamplingParams
from tests.tiny import CharTokenizer, hf_model, save_hf

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Small enough for seconds: a short corpus the target writes itself, short windows, a few hundred steps.
QUICK = ["--hours", "0.05", "--dtype", "fp32", "--sequences", "24", "--request-tokens", "16", "--answer-tokens", "40",
         "--seq-len", "64", "--draft-vocab", "64", "--holdout", "0.2", "--train-dtype", "fp32", "--quiet"]


def save_tokenizer(folder: Path) -> None:
    """A character tokenizer (the tiny alphabet) with chat markers and a chat template, as tokenizer.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models

    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(CharTokenizer.ALPHABET)}, merges=[]))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": TEMPLATE}))


def tiny_target(folder: Path, seed: int = 0, arch: str = "qwen2") -> Path:
    """A random target (qwen2 by default) saved as a Hugging Face folder with its tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    save_hf(hf_model(arch, seed=seed, vocab=len(CharTokenizer.ALPHABET) + 2), folder)
    save_tokenizer(folder)
    return folder


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    return tiny_target(tmp_path_factory.mktemp("target"))


def _train(*args: str) -> int:
    """`augury train`; the tiny target writes its own corpus unless a test names one (its character
    alphabet cannot read the standard library, whose default corpus has tests of its own)."""
    return main(["train", *args] + ([] if "--corpus" in args else ["--corpus", "self"]))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_train_end_to_end_beats_the_untrained_head_and_drafts_losslessly(dtype, target_dir, home, capsys):
    out = home / "head"
    code = _train("--model", str(target_dir), "--kind", "eagle", "--out", str(out), "--max-steps", "300", *QUICK,
                  "--sequences", "40", "--holdout", "0.25", "--train-dtype", dtype)  # 10 answers held out
    assert code == 0, capsys.readouterr().err
    meta = json.loads((out / "head.json").read_text())
    assert meta["train"]["dtype"] == dtype
    trained, untrained = meta["alpha"][0], meta["alpha_untrained"][0]
    trials = meta["alpha_counts"]["trials"][0]
    assert trials >= 200, f"only {trials} held-out positions measured"
    assert trained > untrained + 0.05, (
        f"after {meta['train']['steps']} steps the head's held-out top-1 agreement is {trained:.3f}, "
        f"not above the untrained head's {untrained:.3f} (over {trials} positions)")
    assert meta["train"]["steps"] == 300
    assert meta["kind"] == "eagle" and meta["target"]["sha256"] and meta["vocab_size"] <= 64
    assert meta["data"]["sources"][0]["source"] == "self" and meta["data"]["tokens"] > 500
    assert "wrote" in capsys.readouterr().out

    from augury.models.loader import load_model
    from augury.proposers.heads import load_head

    target = load_model(str(target_dir), dtype="fp32")
    proposer = load_head(out, target)
    assert proposer.meta["alpha"] == meta["alpha"]
    prompt = target.tokenizer.encode_chat([{"role": "user", "content": "hello there"}])
    plain = Engine(target).generate(prompt, SamplingParams(max_tokens=30, ignore_eos=True))
    spec = Engine(target, proposer, k=4).generate(prompt, SamplingParams(max_tokens=30, ignore_eos=True))
    assert spec.token_ids == plain.token_ids
    assert spec.stats.accepted > 0, "the trained head never drafted an accepted token"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["mtp", "parallel"])
def test_train_other_kinds_beat_their_untrained_heads(kind, target_dir, home):
    out = home / kind
    assert _train("--model", str(target_dir), "--kind", kind, "--out", str(out), "--max-steps", "300", *QUICK,
                  "--sequences", "40", "--holdout", "0.25") == 0
    meta = json.loads((out / "head.json").read_text())
    assert meta["alpha"][0] > meta["alpha_untrained"][0] + 0.05, (
        f"{kind}: held-out top-1 {meta['alpha'][0]:.3f} vs untrained {meta['alpha_untrained'][0]:.3f}")


def test_auto_train_dtype_keeps_the_faster_by_its_probe():
    from augury.train.precision import Precision, choose_precision

    device = torch.device("cpu")
    slow_bf16 = choose_precision("auto", device, 64, timer=lambda dtype, *_: 5.0 if dtype == torch.bfloat16 else 2.0)
    fast_bf16 = choose_precision("auto", device, 64, timer=lambda dtype, *_: 1.0 if dtype == torch.bfloat16 else 4.0)
    assert (slow_bf16.dtype, fast_bf16.dtype) == ("fp32", "bf16")
    assert fast_bf16.probe_ms == {"fp32": 4.0, "bf16": 1.0}
    assert choose_precision("fp32", device, 64) == Precision("fp32")  # asked for: no probe
    measured = choose_precision("auto", device, 64)  # the real probe: both dtypes timed
    assert set(measured.probe_ms) == {"fp32", "bf16"} and min(measured.probe_ms.values()) > 0
    with measured.autocast(device):
        product = torch.ones(4, 8) @ torch.ones(8, 2)
    assert product.dtype == (torch.bfloat16 if measured.dtype == "bf16" else torch.float32)


def test_an_unknown_train_dtype_is_refused(target_dir, home, capsys):
    from augury.train.precision import choose_precision

    with pytest.raises(AuguryError, match="unknown --train-dtype 'fp8'"):
        choose_precision("fp8", torch.device("cpu"), 64)
    with pytest.raises(SystemExit):
        _train("--model", str(target_dir), "--kind", "eagle", "--out", str(home / "h"), *QUICK, "--train-dtype", "fp8")
    assert "invalid choice: 'fp8'" in capsys.readouterr().err


def test_resume_continues_from_the_checkpoint_and_a_second_run_needs_resume(target_dir, home, capsys):
    out = home / "head"
    args = ["--model", str(target_dir), "--kind", "mtp", "--out", str(out), *QUICK]
    assert _train(*args, "--max-steps", "20") == 0
    first = json.loads((out / "head.json").read_text())
    assert _train(*args, "--max-steps", "20") == 2
    assert "already holds a training run; pass --resume" in capsys.readouterr().err
    assert _train(*args, "--max-steps", "15", "--resume") == 0
    second = json.loads((out / "head.json").read_text())
    assert first["train"]["steps"] == 20 and second["train"]["steps"] == 35
    assert second["data"] == first["data"], "resuming reuses the collected corpus"
    assert second["alpha_untrained"] == first["alpha_untrained"]


def test_another_kind_trains_on_a_runs_collected_states(target_dir, home, tmp_path_factory, capsys):
    first = home / "eagle"
    assert _train("--model", str(target_dir), "--kind", "eagle", "--out", str(first), "--max-steps", "5", *QUICK) == 0
    eagle = json.loads((first / "head.json").read_text())
    second = home / "parallel"
    assert _train("--model", str(target_dir), "--kind", "parallel", "--out", str(second), "--max-steps", "5",
                  *QUICK, "--features-from", str(first)) == 0
    borrowed = json.loads((second / "head.json").read_text())
    assert borrowed["kind"] == "parallel" and borrowed["train"]["steps"] == 5
    assert borrowed["data"]["tokens"] == eagle["data"]["tokens"] and borrowed["data"]["sources"] == eagle["data"]["sources"]
    assert not list((second / "work").glob("features-*")), "the states were collected or copied again"
    assert "training on the states collected in" in capsys.readouterr().out

    refused = [  # (extra args, what the one-line error names)
        (["--kind", "mtp"], "holds the target's final states and this mtp head reads its last_layer ones "
                            "(pass --feature final)"),
        (["--kind", "eagle", "--resume"], "takes neither --resume nor --data"),
    ]
    for extra, message in refused:
        out = home / f"refused-{len(extra)}"
        assert _train("--model", str(target_dir), "--out", str(out), *QUICK, *extra, "--features-from", str(first)) != 0
        assert message in capsys.readouterr().err
    other = tiny_target(tmp_path_factory.mktemp("other"), seed=1)
    assert _train("--model", str(other), "--kind", "eagle", "--out", str(home / "other"), *QUICK,
                  "--features-from", str(first)) != 0
    assert "was collected for target" in capsys.readouterr().err
    assert _train("--model", str(target_dir), "--kind", "eagle", "--out", str(home / "none"), *QUICK,
                  "--features-from", str(home / "nowhere")) != 0
    assert "holds no collected states" in capsys.readouterr().err


def test_training_on_given_data_only(target_dir, home):
    data = home / "data.jsonl"
    lines = [{"messages": [{"role": "user", "content": "abc " * 5}, {"role": "assistant", "content": "def " * 8}]},
             {"text": "the quick brown fox jumps over the lazy dog. " * 2}] * 6
    data.write_text("\n".join(json.dumps(line) for line in lines) + "\n\n")
    out = home / "head"
    assert _train("--model", str(target_dir), "--kind", "eagle", "--out", str(out), "--corpus", "none",
                  "--data", str(data), "--max-steps", "10", *QUICK, "--seq-len", "128") == 0
    meta = json.loads((out / "head.json").read_text())
    assert meta["data"]["sources"] == [{"source": str(data), "kind": "jsonl", "records": 12}]
    assert meta["data"]["sequences"] == 12


@pytest.mark.parametrize("line, message", [
    ("{not json", "line 2: not JSON"),
    ('["a list"]', 'line 2: expected an object with "messages"'),
    ('{"text": 5}', 'line 2: "text" must be a string'),
    ('{"messages": [{"role": "user"}]}', 'line 2: "messages" must be a non-empty list'),
])
def test_a_bad_data_line_is_named_by_its_number(line, message, target_dir, home, capsys):
    data = home / "data.jsonl"
    data.write_text(json.dumps({"text": "fine"}) + "\n" + line + "\n")
    code = _train("--model", str(target_dir), "--kind", "eagle", "--out", str(home / "h"), "--data", str(data),
                  "--corpus", "none", *QUICK)
    err = capsys.readouterr().err
    assert code == 2 and f"--data {data}: {message}" in err and err.count("\n") == 1, err


def test_unreadable_or_empty_data_is_one_clear_error(target_dir, home, capsys):
    cases = [
        (home / "missing.jsonl", "cannot read --data"),
        (home / "empty_dir", "no .txt or .md files in that folder"),
        (home / "binary.jsonl", "cannot read --data"),
        (home / "blank.jsonl", "no records"),
    ]
    (home / "empty_dir").mkdir()
    (home / "binary.jsonl").write_bytes(b"\xff\xfe\x00bad")
    (home / "blank.jsonl").write_text("\n\n")
    for path, message in cases:
        code = _train("--model", str(target_dir), "--kind", "eagle", "--out", str(home / "h"), "--data", str(path),
                      "--corpus", "none", *QUICK)
        err = capsys.readouterr().err
        assert code == 2 and message in err, (path, err)
        assert not (home / "h").exists()  # a run that failed before writing anything leaves no empty OUT/work/
    kept = home / "kept"
    kept.mkdir()
    (kept / "notes.txt").write_text("the user's own file")
    assert _train("--model", str(target_dir), "--kind", "eagle", "--out", str(kept), "--data", str(cases[0][0]),
                  "--corpus", "none", *QUICK) == 2
    capsys.readouterr()
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]  # its folder stays, the empty work/ goes
    assert _train("--model", str(target_dir), "--kind", "eagle", "--out", str(home / "h"), "--corpus", "none",
                  *QUICK) == 2
    assert "--corpus none needs --data" in capsys.readouterr().err
    assert _train("--model", str(target_dir), "--kind", "eagle", "--out", str(home / "h2"), "--resume", *QUICK) == 2
    assert "holds no training run to continue" in capsys.readouterr().err


def test_a_text_folder_is_a_corpus(target_dir, home):
    from augury.models.loader import load_model
    from augury.train.corpus import read_data

    folder = home / "texts"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("hello world. " * 20)
    (folder / "sub" / "b.md").write_text("# title\nsome notes")
    (folder / "ignored.bin").write_bytes(b"\x00")
    corpus = read_data(folder, load_model(str(target_dir), dtype="fp32"), max_len=64)
    assert corpus.description == [{"source": str(folder), "kind": "text folder", "files": 2}]
    # a.txt's 260 characters in windows of 64 (a tail of 4 still trains), then b.md's 18
    assert [len(s) for s in corpus.sequences] == [64, 64, 64, 64, 4, 18]


def test_a_full_disk_keeps_the_previous_checkpoint(home, monkeypatch):
    from augury import files
    from augury.train import trainer

    path = home / "checkpoint.pt"
    trainer._save_checkpoint(path, {"step": 1})
    monkeypatch.setattr(files.os, "replace", lambda src, dst: (_ for _ in ()).throw(OSError(28, "No space")))
    with pytest.raises(AuguryError, match="no space left on device .*previous checkpoint is kept"):
        trainer._save_checkpoint(path, {"step": 2})
    monkeypatch.undo()
    assert torch.load(path)["step"] == 1
    assert [p.name for p in home.iterdir() if p.name.startswith(".")] == []


def test_magpie_corpus_starts_from_the_user_prefix(target_dir, home):
    import time

    from augury.models.loader import load_model
    from augury.train.corpus import SelfCorpusPlan, self_corpus, user_prefix_ids

    target = load_model(str(target_dir), dtype="fp32")
    prefix = user_prefix_ids(target)
    assert target.tokenizer.decode(prefix, skip_special=False) == "<|im_start|>user\n"
    corpus = self_corpus(target, SelfCorpusPlan(request_tokens=8, answer_tokens=12, max_batch=3),
                         deadline=time.monotonic() + 60, max_sequences=5)
    assert len(corpus.sequences) == 5
    for seq, text in zip(corpus.sequences, corpus.texts):
        asked = target.tokenizer.encode_chat([{"role": "user", "content": text["request"]}])
        assert seq[: len(asked)] == asked, "each sequence is the request in the template, then the answer"
        assert len(seq) - len(asked) <= 12


@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_states_recorded_while_writing_equal_a_prefill_of_what_was_written(kind, target_dir, home):
    """The corpus's features come from the scheduler's own steps (no second prefill): the same states
    and top-k as one prefill of each sequence (short sequences: both attend row by row, bitwise)."""
    import time

    from augury.models.head import HeadConfig, feature_layers
    from augury.models.loader import load_model
    from augury.train import features
    from augury.train.corpus import SelfCorpusPlan, StateRecorder, self_corpus

    target = load_model(str(target_dir), dtype="fp32")
    config = HeadConfig.for_kind(kind)
    corpus = self_corpus(target, SelfCorpusPlan(request_tokens=8, answer_tokens=16, max_batch=3),
                         deadline=time.monotonic() + 60, max_sequences=4,
                         recorder=StateRecorder(feature_layers(config, target.config)))
    recorded, prefilled = features.ShardWriter(home / "a"), features.ShardWriter(home / "b")
    (home / "a").mkdir(), (home / "b").mkdir()
    for ids, states in zip(corpus.sequences, corpus.states):
        n = features.add_recorded(recorded, target, config, ids, states, k=4)
        assert len(ids) - 3 <= n <= len(ids) - 1, "only the last step's positions may go without states"
        features.collect(target, [ids[:n]], config, prefilled, topk=4)
    a, b = features.load(recorded.flush()), features.load(prefilled.flush())
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.offsets, b.offsets)
    assert torch.equal(a.states, b.states)
    assert torch.equal(a.topk_ids, b.topk_ids)
    assert torch.allclose(a.topk_logprobs, b.topk_logprobs, atol=2e-3)  # stored in fp16


def test_a_target_without_a_chat_template_needs_data(home):
    from augury.models.loader import load_model
    from augury.train.corpus import user_prefix_ids

    folder = tiny_target(home / "plain")
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}))
    with pytest.raises(AuguryError, match="needs the target's chat template.*give --data"):
        user_prefix_ids(load_model(str(folder), dtype="fp32"))

