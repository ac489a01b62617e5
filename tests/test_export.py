"""`augury export-head`: the speculators package's own classes load the export and draft augury's head's logits.

The load test needs speculators (installed with --no-deps next to CPU torch, as
the Makefile's venv step does) and skips with the import error where it cannot
be imported; the refusals need nothing but augury.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from augury.cli import main
from tests.test_train import QUICK, _train, tiny_target
from tests.tiny import hf_model, save_hf


@pytest.fixture(scope="module")
def qwen3_target(tmp_path_factory) -> Path:
    """A random qwen3 target (the family speculators' MTP layer is built for) as a Hugging Face folder."""
    return tiny_target(tmp_path_factory.mktemp("qwen3"), arch="qwen3")


def speculator_classes():
    """speculators' SpeculatorModel and MTPDraftModel, or a skip that says why they cannot be imported."""
    try:
        from speculators import SpeculatorModel
        from speculators.models import MTPDraftModel
    except Exception as exc:  # noqa: BLE001 - any import failure of the optional package is a reason to skip
        pytest.skip(f"speculators cannot be imported here ({type(exc).__name__}: {exc}); `make venv` installs "
                    "speculators==0.9.0 with --no-deps and the modules it imports")
    return SpeculatorModel, MTPDraftModel


def chained_logits(head, states: torch.Tensor, tokens: torch.Tensor, steps: int, *, chain) -> list[torch.Tensor]:
    """augury's head unrolled as MTPDraftModel.forward unrolls a sequence: step k pairs the state of step k - 1
    (the target's at k = 0) at row t with token t + k + 1, over the first T - steps - 1 rows, causal, from an
    empty cache; chain maps the head's output to the next step's state. -> [steps] x [1, rows, N] logits."""
    rows = tokens.shape[1] - steps - 1
    state, out = states, []
    for step in range(steps):
        x = head.inputs(state[:, :rows], head.embed(tokens[:, step + 1: step + 1 + rows]))
        y = head.layer(x, head.new_cache(1, rows))
        out.append(head.logits(y))
        state = chain(y)
    return out


@pytest.mark.parametrize("kind", [["--kind", "eagle"], ["--kind", "mtp", "--feature", "final"]], ids=["eagle", "mtp"])
def test_export_loads_through_speculators_and_drafts_the_heads_logits(kind, qwen3_target, home, capsys):
    SpeculatorModel, MTPDraftModel = speculator_classes()
    from safetensors.torch import load_file

    from augury.models.loader import load_model
    from augury.proposers.heads import load_head

    out = home / "head"
    assert _train("--model", str(qwen3_target), *kind, "--out", str(out), "--max-steps", "5", *QUICK,
                  "--save-dtype", "fp32") == 0  # fp32 throughout, so that the comparison below can be tight
    assert main(["export-head", str(out), "--k", "3", "--verifier", str(qwen3_target)]) == 0
    said = capsys.readouterr().out
    spec = out / "speculators"
    config = json.loads((spec / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == str(qwen3_target.resolve())
    verifier_config = json.loads((qwen3_target / "config.json").read_text())
    assert config["transformer_layer_config"]["num_hidden_layers"] == verifier_config["num_hidden_layers"]
    assert not (spec / "draft_vocab.safetensors").exists()

    model = SpeculatorModel.from_pretrained(str(spec))  # the registry picks the class from config.json
    assert type(model) is MTPDraftModel and model.config.num_speculative_steps == 3
    model = model.float().eval()
    loaded = model.state_dict()
    for name, tensor in load_file(str(spec / "model.safetensors")).items():
        assert torch.equal(loaded[name], tensor), f"{name} was not loaded as written"

    target = load_model(str(qwen3_target), dtype="fp32")
    head = load_head(out, target).head
    assert f"verifier's {target.config.vocab_size} tokens (the head was trained on {head.weights.vocab.numel()})" in said
    assert torch.equal(model.lm_head.weight, target.decoder.weights.lm_head)
    assert torch.equal(model.embed_tokens.weight, target.decoder.weights.embed)

    gen = torch.Generator().manual_seed(0)
    states = torch.randn(1, 12, target.config.hidden_size, generator=gen)
    tokens = torch.randint(0, target.config.vocab_size, (1, 12), generator=gen)
    with torch.no_grad():
        theirs, _, _ = model(input_ids=tokens, hidden_states=states)
        ours = chained_logits(head, states, tokens, len(theirs), chain=head.state)
        raw = chained_logits(head, states, tokens, len(theirs), chain=lambda y: y)
    vocab = head.weights.vocab
    assert len(theirs) == 3
    for step, (t, o) in enumerate(zip(theirs, ours)):
        gap = float((t[..., vocab] - o).abs().max())
        assert gap < 1e-4, f"chained step {step}: speculators' logits differ from augury's head by {gap:.2e}"
    # the reason last_layer heads are refused: chaining the raw output is another function from step 1 on
    gap = float((theirs[1][..., vocab] - raw[1]).abs().max())
    assert gap > 1e-2, f"chaining the head's raw output should differ from speculators' normed chain; gap {gap:.2e}"


def test_heads_without_a_faithful_layout_are_refused_with_the_reason(qwen3_target, home, capsys):
    cases = [
        (qwen3_target, ["--kind", "parallel"], "a parallel head has no speculators layout"),
        (qwen3_target, ["--kind", "mtp"], "feature last_layer) and chains its raw output"),
        (tiny_target(home / "qwen2"), ["--kind", "eagle"], "a head of a qwen2 target has no faithful layout"),
    ]
    for number, (target, kind, message) in enumerate(cases):
        out = home / f"head{number}"
        assert _train("--model", str(target), *kind, "--out", str(out), "--max-steps", "1", *QUICK) == 0
        capsys.readouterr()
        assert main(["export-head", str(out)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert not (out / "speculators" / "config.json").exists()
    assert main(["export-head", str(home / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_verifier_folder_of_another_model_is_refused(qwen3_target, home, capsys):
    out = home / "head"
    assert _train("--model", str(qwen3_target), "--kind", "eagle", "--out", str(out), "--max-steps", "1", *QUICK) == 0
    other = home / "other"
    save_hf(hf_model("qwen3", seed=1, vocab=50), other)
    assert main(["export-head", str(out), "--verifier", str(other)]) == 2
    assert "is not this head's target" in capsys.readouterr().err
    assert main(["export-head", str(out), "--verifier", "org/name", "--out", str(home / "spec")]) == 0
    config = json.loads((home / "spec" / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == "org/name"
