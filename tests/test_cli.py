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
