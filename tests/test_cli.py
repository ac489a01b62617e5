"""The command line's options: each belongs to the methods that read it, and a misplaced one is one line.

(Each command's own refusals are tested with it: test_bench.py, test_loading.py, test_store.py, ...)
"""

from __future__ import annotations

import pytest

from augury.cli import main
from augury.errors import AuguryError
from augury.proposers import build_proposer
from augury.proposers.options import NgramOptions, SuffixOptions, split_options
from tests.tiny import tiny_model


def test_an_option_the_method_does_not_read_is_an_error_naming_it():
    target = tiny_model(vocab=24, seed=3, hidden=32, layers=3)
    with pytest.raises(AuguryError, match=r"--ngram-max is not an option of draft method 'suffix'"):
        build_proposer("suffix", target, ngram_max=3)
    with pytest.raises(AuguryError, match=r"--skip-layers is not an option of plain decoding"):
        build_proposer("plain", target, skip_layers="1")
    assert build_proposer("ngram", target, ngram_min=2, ngram_max=3).ngram_max == 3


def test_cli_refuses_an_unused_option_with_one_line(capsys):
    code = main(["generate", "--draft-method", "ngram", "--draft-vocab", "100", "hello"])
    err = capsys.readouterr().err
    assert code == 2
    assert "--draft-vocab is not an option of draft method 'ngram'" in err


def test_bench_refuses_an_option_no_given_method_reads():
    split = split_options({"ngram_max": 3, "dtype": "fp32"}, {"ngram": NgramOptions, "suffix": SuffixOptions})
    assert split == {"ngram": {"ngram_max": 3, "dtype": "fp32"}, "suffix": {"dtype": "fp32"}}
    with pytest.raises(AuguryError, match="--skip-layers is not an option of any of the methods given"):
        split_options({"skip_layers": "1"}, {"ngram": NgramOptions})


def test_demo_refuses_fewer_than_one_run_before_loading_anything(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--offline", "--runs", "0"])
    assert exit_info.value.code == 2
    assert "argument --runs: must be at least 1, got 0" in capsys.readouterr().err


# Bad input found by an outside probe of the CLI (2026-12-05): each gets one line and a non-zero exit before
# any model loads (these commands would load one next, so a test that loads nothing proves the order).
@pytest.mark.parametrize("argv, message", [
    (["serve", "--host", ""], "--host is empty"),
    (["serve", "--host", "not a host!"], "--host 'not a host!' is not an address this machine can bind"),
    (["serve", "--api-key", ""], "--api-key (or $AUGURY_API_KEY) is empty"),
    (["serve", "--api-key", " key"], "--api-key starts or ends with whitespace"),
    (["serve", "--served-model-name", " "], "--served-model-name is empty"),
    (["serve", "--queue-timeout", "-1"], "--queue-timeout must be >= 0"),
    (["generate", "--draft-method", "plain", "caf\udcc3 au lait"], "the prompt is not valid UTF-8 text (a byte 0xc3"),
    (["generate", "--draft-method", "plain", "--system", "terse", "hi"], "--system is the chat template's"),
    (["calibrate", "--out", "/proc/no-such-dir/c.json"], "--out /proc/no-such-dir/c.json: cannot create"),
    (["calibrate", "--out", "/"], "--out / is a folder"),
    (["loadtest", "--out", "/proc/no-such-dir/l.json"], "--out /proc/no-such-dir/l.json: cannot create"),
    (["profile", "--decode-tokens", "0"], "--decode-tokens must be at least 1, got 0"),
    (["demo", "--prompt", " "], "empty --prompt"),
    (["generate", "--stop", "", "hi"], "stop strings must be non-empty text"),
    (["generate", "-t", "1", "--seed", str(2**64), "hi"], "seed must be an integer in [-2**63, 2**64)"),
    (["generate", "-t", "1", "--seed", str(-(2**63) - 1), "hi"], "seed must be an integer in [-2**63, 2**64)"),
    (["generate", "-n", "2000000000", "hi"], "max_tokens must be an integer in [1, "),
    (["generate", "--draft-method", "plain", "--k", "4", "hi"], "--k is not an option of plain decoding"),
    (["serve", "--draft-method", "plain", "--fixed-k"], "--fixed-k is not an option of plain decoding"),
    (["serve", "--draft-method", "plain", "--k=2", "--fixed-k"], "--k and --fixed-k are not options of plain"),
])
def test_bad_input_is_one_line_before_any_model_loads(capsys, argv, message):
    assert main([*argv, "--offline"]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_bench_refuses_an_unwritable_out_and_contradictory_flags(capsys, tmp_path):
    suite = tmp_path / "one.jsonl"
    suite.write_text('{"prompt": "hi"}\n')
    base = ["bench", "--offline", "--suite", str(suite), "--methods", "plain"]
    assert main([*base, "--out", "/proc/no-such-dir/run"]) == 2
    assert "--out /proc/no-such-dir/run: cannot create" in capsys.readouterr().err
    assert main([*base, "--out", str(tmp_path / "run"), "--resume", "--overwrite"]) == 2
    assert "give one of them" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["serve", "--log-level", "bogus"], "argument --log-level: invalid choice: 'bogus'"),
    (["train", "--hours", "inf", "--out", "x"], "argument --hours: must be a finite number, got inf"),
    (["train", "--hours", "nan", "--out", "x"], "argument --hours: must be a finite number, got nan"),
    (["train", "--hours", "1", "--lr", "nan", "--out", "x"], "argument --lr: must be a finite number, got nan"),
    (["train", "--hours", "1", "--noise", "inf", "--out", "x"], "argument --noise: must be a finite number"),
])
def test_argument_values_refused_by_the_parser(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def _run_cli(argv: list[str], stdout) -> "subprocess.CompletedProcess":
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", "import sys; from augury.cli import main; sys.exit(main())", *argv],
                          stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)


def test_a_closed_or_full_stdout_ends_without_a_traceback():
    """`augury ... | head` closes the pipe: exit 141, nothing on stderr; a full disk: one line, exit 1."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)
    with os.fdopen(write_end, "w") as closed:
        done = _run_cli(["models", "list"], closed)
    assert (done.returncode, done.stderr) == (141, "")
    with open("/dev/full", "w") as full:
        done = _run_cli(["models", "list"], full)
    assert done.returncode == 1 and done.stderr.startswith("augury: error: [Errno 28]") and "Traceback" not in done.stderr


def test_models_pull_and_rm_take_known_names_only(capsys):
    for sub in ("pull", "rm"):
        assert main(["models", sub, "/tmp/x.gguf"]) == 2
        err = capsys.readouterr().err
        assert "unknown model '/tmp/x.gguf'" in err and "give a path" not in err


def test_serve_says_when_the_kv_budget_is_more_than_the_context_holds(tmp_path, monkeypatch, capsys):
    """A KV budget beyond max batch x context is capped at the context; serve says so instead of starting
    with less than asked without a word (and says nothing where the budget fits)."""
    import augury.server.running as running
    from tests.test_train import tiny_target

    started = []
    monkeypatch.setattr(running, "serve", lambda app, host, port, **kw: started.append(port))
    folder = tiny_target(tmp_path / "target")
    base = ["serve", "--model", str(folder), "--draft-method", "plain", "--max-batch", "2", "--prefix-cache-gb", "0"]
    assert main([*base, "--kv-budget-tokens", "100000000"]) == 0
    err = capsys.readouterr().err
    assert "--kv-budget-tokens 100000000 would give each of 2 rows 50000000 tokens, more than the model's context" in err
    assert main([*base, "--kv-budget-tokens", "64"]) == 0
    err = capsys.readouterr().err
    assert "more than the model's context" not in err and "with up to 2 sequences of 32 tokens" in err
    assert started == [8000, 8000]
