"""GGUF loading on files written here, and clear errors for bad model files."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from augury.errors import AuguryError
from augury.models.loader import load_model
from augury.proposers.draft_model_build import check_same_vocabulary
from tests.gguf_files import cli_home, write_hf_as_gguf
from tests.tiny import hf_model

VOCAB = 96


def write_llama_gguf(path: Path, model, *, arch: str = "llama", quant=None, odd_tensor_type=None) -> Path:
    """A transformers llama model as a GGUF file the way llama.cpp lays it out (tests/gguf_files.py)."""
    return write_hf_as_gguf(path, model, arch=arch, quant=quant, odd_tensor_type=odd_tensor_type)


@pytest.fixture(scope="module")
def llama():
    return hf_model("llama")


def _logits(path: Path, tokens: torch.Tensor, tmp_path: Path, monkeypatch) -> torch.Tensor:
    monkeypatch.setenv("AUGURY_HOME", str(tmp_path / "home"))
    model = load_model(str(path), dtype="fp32", weights="bf16", progress=False)  # dequantized: transformers' numbers
    return model.decoder.forward(tokens, model.decoder.new_cache(1, 64))


def test_gguf_llama_matches_transformers(llama, tmp_path, monkeypatch):
    """Covers the GGUF path end to end, including undoing llama.cpp's q/k permutation."""
    path = write_llama_gguf(tmp_path / "tiny.gguf", llama)
    tokens = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(0))
    ours = _logits(path, tokens, tmp_path, monkeypatch)
    with torch.no_grad():
        ref = llama(tokens).logits.float()
    rel = float((ours - ref).abs().max() / ref.abs().max())
    assert rel < 1e-4, f"relative error {rel:.2e}"
    # The second load comes from the converted-weights cache and gives the same tensors.
    again = _logits(path, tokens, tmp_path, monkeypatch)
    assert torch.equal(again, ours)
    assert list((tmp_path / "home" / "converted").glob("*/weights-float32.safetensors"))


def test_gguf_q8_0_weights_are_dequantized(llama, tmp_path, monkeypatch):
    import gguf

    path = write_llama_gguf(tmp_path / "q8.gguf", llama, quant=gguf.GGMLQuantizationType.Q8_0)
    tokens = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(1))
    ours = _logits(path, tokens, tmp_path, monkeypatch)
    with torch.no_grad():
        ref = llama(tokens).logits.float()
    rel = float((ours - ref).abs().max() / ref.abs().max())
    assert 0 < rel < 5e-2, f"Q8_0 logits should be close to, not equal to, fp32: relative error {rel:.2e}"


def test_unsupported_architecture_is_named(llama, tmp_path, monkeypatch):
    path = write_llama_gguf(tmp_path / "mamba.gguf", llama, arch="mamba")
    monkeypatch.setenv("AUGURY_HOME", str(tmp_path / "home"))
    with pytest.raises(AuguryError, match="unsupported architecture 'mamba'"):
        load_model(str(path), progress=False)


def test_unsupported_quantization_is_named(llama, tmp_path, monkeypatch):
    import gguf

    path = write_llama_gguf(tmp_path / "iq.gguf", llama, odd_tensor_type=gguf.GGMLQuantizationType.IQ2_XXS)
    monkeypatch.setenv("AUGURY_HOME", str(tmp_path / "home"))
    with pytest.raises(AuguryError, match="IQ2_XXS"):
        load_model(str(path), progress=False)


def test_truncated_and_foreign_files_are_refused(llama, tmp_path, monkeypatch):
    monkeypatch.setenv("AUGURY_HOME", str(tmp_path / "home"))
    path = write_llama_gguf(tmp_path / "full.gguf", llama)
    data = path.read_bytes()
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(AuguryError, match="truncated or corrupt"):
        load_model(str(truncated), progress=False)
    foreign = tmp_path / "notes.gguf"
    foreign.write_text("hello")
    with pytest.raises(AuguryError, match="not a GGUF file"):
        load_model(str(foreign), progress=False)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "/nonexistent/model.gguf"], "not found"),
        (["--model", "no-such-model"], "unknown model"),
        (["--model", "TRUNCATED"], "truncated or corrupt"),
    ],
)
def test_cli_reports_bad_models_in_one_line(args, message, llama, tmp_path):
    path = write_llama_gguf(tmp_path / "full.gguf", llama)
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(path.read_bytes()[:4000])
    args = [str(truncated) if a == "TRUNCATED" else a for a in args]
    proc = subprocess.run(
        [sys.executable, "-m", "augury.cli", "generate", "hello", "--offline", *args],
        capture_output=True,
        text=True,
        env={"AUGURY_HOME": str(cli_home(tmp_path)), "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_model_whose_tokenizer_file_is_the_targets_shares_its_parsed_tokenizer(llama, tmp_path, monkeypatch):
    """A drafter of the target's family reuses the target's parsed tokenizer (its own meta kept);
    a tokenizer.json with other bytes is parsed on its own."""
    monkeypatch.setenv("AUGURY_HOME", str(tmp_path / "home"))
    paths = [write_llama_gguf(tmp_path / f"{name}.gguf", llama) for name in ("target", "draft", "other")]
    for path in paths:  # the first load converts; the shared tokenizer comes from the cache's files
        load_model(str(path), dtype="fp32", weights="bf16", progress=False)
    folders = {p.name.split(".gguf-")[0]: p for p in (tmp_path / "home" / "converted").iterdir()}
    meta = folders["draft"] / "augury_tokenizer.json"
    meta.write_text(meta.read_text().replace('"chat_template": null', '"chat_template": "{{ messages }}"'))
    tokenizer_json = folders["other"] / "tokenizer.json"
    tokenizer_json.write_text(tokenizer_json.read_text() + "\n")  # the same tokenizer in other bytes

    def load(name, share=None):
        return load_model(str(tmp_path / f"{name}.gguf"), dtype="fp32", weights="bf16", progress=False,
                          share_tokenizer=share)

    target = load("target")
    draft, other, alone = load("draft", target.tokenizer), load("other", target.tokenizer), load("draft")
    assert draft.tokenizer.backend is target.tokenizer.backend
    assert draft.tokenizer.plain_backend is target.tokenizer.plain_backend
    assert draft.tokenizer.meta.chat_template == "{{ messages }}" != target.tokenizer.meta.chat_template
    assert other.tokenizer.backend is not target.tokenizer.backend
    assert alone.tokenizer.backend is not target.tokenizer.backend
    text = "the <s> quick brown fox"
    for special in (True, False):
        ids = target.tokenizer.encode(text, special=special)
        assert draft.tokenizer.encode(text, special=special) == ids == other.tokenizer.encode(text, special=special)
    check_same_vocabulary(target, draft)  # one tokenizer: accepted
    small = SimpleNamespace(name="small", tokenizer=draft.tokenizer,
                            config=replace(draft.config, vocab_size=draft.config.vocab_size - 1))
    with pytest.raises(AuguryError, match="past its vocabulary"):  # a head short of a named id, shared or not
        check_same_vocabulary(target, small)
