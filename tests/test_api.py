"""The top-level API: the README's Python example runs as written, on tiny stand-in models."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import augury
from augury.errors import AuguryError
from tests.tiny import tiny_model

README = Path(__file__).resolve().parents[1] / "README.md"
VOCAB = 96  # the tiny alphabet covers the README's prompt


def _readme_python_example() -> str:
    section = README.read_text().split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readmes_python_example_runs_and_its_assertion_holds(monkeypatch, capsys):
    """The example loads the default target and draft by name; here those names load tiny models
    (a 3-layer target, a 1-layer drafter with the same tokenizer), everything else is the real code."""
    import augury.api
    import augury.models.loader

    models = {
        "qwen2.5-coder-1.5b-instruct": tiny_model(vocab=VOCAB, seed=3, layers=3, hidden=32),
        "qwen2.5-coder-0.5b-instruct": tiny_model(vocab=VOCAB, seed=3, layers=1, hidden=32),
    }
    loaded = []

    def fake_load(name, **kwargs):
        loaded.append(name)
        return models[name]

    monkeypatch.setattr(augury.api, "load_model", fake_load)
    monkeypatch.setattr(augury.models.loader, "load_model", fake_load)
    exec(compile(_readme_python_example(), str(README), "exec"), {})
    out = capsys.readouterr().out
    assert loaded == ["qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"]
    assert "tok/s" in out and "tau" in out, out


def test_load_refuses_an_option_of_another_method():
    with pytest.raises(AuguryError, match="--draft-vocab is not an option of draft method 'ngram'"):
        augury.load(tiny_model(vocab=VOCAB), draft_method="ngram", draft_vocab=10)


def test_stream_yields_the_text_generate_returns_and_keeps_the_result():
    llm = augury.load(tiny_model(vocab=VOCAB, seed=2, layers=2), draft_method="ngram", k=3)
    text = "".join(llm.stream("abcabcabc", max_tokens=20))
    result = llm.generate("abcabcabc", max_tokens=20)
    assert text == result.text and llm.last_result.token_ids == result.token_ids
    assert llm.generate("abc", chat=True, max_tokens=5).token_ids == llm.generate(
        [{"role": "user", "content": "abc"}], max_tokens=5).token_ids
