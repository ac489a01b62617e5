"""A chained head in the speculators layout that speculators' own classes load (`vllm serve DIR` on a GPU).

Which layout, and why only one: speculators 0.9 (the newest release) loads
these draft models with its own classes: MTP (`MTPDraftModel`), EAGLE-3 and
the EAGLE-3-based P-EAGLE, DFlash, DFlash2, DSpark and XPress; it no longer
has an EAGLE-1 class. Only the MTP layer computes augury's chained head:

    speculators' MTPDraftModel:  final_layernorm(layer(input_proj([token_layernorm(e); hidden_layernorm(s)])))
    augury's Head:               final_norm(layer(fc([state_norm(s); token_norm(e)])))    (models/head.py)

so input_proj is fc with its halves swapped, the layer is the head's decoder
layer unfused, and final_layernorm is the target's final norm; the logits are
the verifier's lm_head on that, and the next chained row reads that normed
output (MTPDraftModel.forward passes `mtp_output` on). EAGLE-3's first layer
feeds [norm(e); norm(h)] to a double-width attention with h alone as the
residual, which no setting makes equal to fc-then-layer; the parallel drafters
there are EAGLE-3 layers or inject the verifier's context into every layer.

What is refused, one line each, because the loaded model would compute
something else:
- a parallel head (its mask embeddings have no counterpart);
- a head that reads the residual stream before the final norm (feature
  "last_layer", the mtp kind's default) and chains its raw output, where
  MTPDraftModel chains final_layernorm's output; `--feature final` heads of
  either chained kind export;
- targets other than qwen3: speculators 0.9's MTP layers are the qwen3
  family's decoder layers (with per-head q/k norms) only, and a qwen2 or llama
  layer is not a qwen3 layer with some setting; also rope scaling and a
  non-default query scale, which the written config would not carry.

Vocabulary: MTPDraftModel refuses reduced vocabularies (NotImplementedError),
so the export drafts over the verifier's full vocabulary. The head's own rows
are the target's lm_head rows, so on the N tokens it was trained on the
logits are exactly augury's; the export only lifts the restriction to them
(said in the command's output and in config.json's "augury" block).

The config is what speculators' MTP converter writes: transformer_layer_config
is the verifier's whole config (MTPDraftModel reads its num_hidden_layers as the
verifier layer whose states it drafts from), with the head's MLP width.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from augury.errors import AuguryError
from augury.files import write_atomic
from augury.models.decoder import ModelConfig
from augury.models.head import LAYER_PREFIX
from augury.models.head_file import read_head

SCHEMA_VERSION = "0.9.0"  # the speculators release whose classes load this layout (tests/test_export.py)
# target arch -> (transformers model_type, verifier architecture) that speculators' MTPDraftModel builds
MTP_ARCHITECTURES = {"qwen3": ("qwen3", "Qwen3ForCausalLM")}
PREFIX = "mtp_layers.0."


@dataclass(frozen=True)
class Exported:
    """What export_speculators wrote: config.json's path and the vocabularies (drafted over, trained on)."""

    config: Path
    vocab_size: int
    trained_vocab: int


def refusal(meta: dict, target: ModelConfig) -> str | None:
    """Why this head has no faithful speculators layout, or None when the MTP layout computes it."""
    kind, feature = meta["kind"], (meta.get("config") or {}).get("feature", "final")
    if kind == "parallel":
        return ("a parallel head has no speculators layout: its learned mask embeddings draft a block in one "
                "forward, and speculators' parallel drafters (P-EAGLE, DFlash) are other networks; export an "
                "mtp or eagle head")
    if feature != "final":
        return (f"this {kind} head reads the target's state before the final norm (feature {feature}) and chains its "
                "raw output, where speculators' MTP layer chains its final_layernorm output; train with "
                "--feature final (the eagle kind's default) to export")
    if target.arch not in MTP_ARCHITECTURES:
        return (f"speculators {SCHEMA_VERSION} has MTP layers for qwen3 verifiers only and its EAGLE-3 layer is "
                f"another network, so a head of a {target.arch} target has no faithful layout "
                f"(heads of {', '.join(sorted(MTP_ARCHITECTURES))} targets export)")
    if target.rope_freq_factors is not None or target.query_scale is not None:
        return "the target's rope scaling or query scale is not carried by the written layer config"
    return None


def layer_config(target: ModelConfig, intermediate_size: int) -> dict:
    """The verifier's Hugging Face config (speculators' transformer_layer_config), with the head's MLP width."""
    model_type, architecture = MTP_ARCHITECTURES[target.arch]
    return {
        "model_type": model_type,
        "architectures": [architecture],
        "vocab_size": target.vocab_size,
        "hidden_size": target.hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": target.num_layers,
        "num_attention_heads": target.num_heads,
        "num_key_value_heads": target.num_kv_heads,
        "head_dim": target.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": target.context_length,
        "rms_norm_eps": target.rms_eps,
        "rope_theta": target.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": target.rope_theta},
        "attention_bias": target.qkv_bias,
        "use_sliding_window": False,
        "tie_word_embeddings": target.tie_embeddings,
    }


def speculators_weights(tensors: dict[str, torch.Tensor], target: ModelConfig) -> dict[str, torch.Tensor]:
    """augury head tensors -> MTPDraftModel's names (unfused q/k/v and gate/up; fc halves swapped)."""
    hidden = target.hidden_size
    q_rows, kv_rows = target.num_heads * target.head_dim, target.num_kv_heads * target.head_dim
    layer = {name[len(LAYER_PREFIX):]: t for name, t in tensors.items() if name.startswith(LAYER_PREFIX)}
    fc = tensors["fc"]
    out = {
        "input_proj.weight": torch.cat([fc[:, hidden:], fc[:, :hidden]], dim=1),  # speculators: [embedding; state]
        "hidden_layernorm.weight": tensors["state_norm"],
        "token_layernorm.weight": tensors["token_norm"],
        "final_layernorm.weight": tensors["target.final_norm"],
        "input_layernorm.weight": layer["attn_norm"],
        "post_attention_layernorm.weight": layer["mlp_norm"],
        "self_attn.o_proj.weight": layer["wo"],
        "mlp.down_proj.weight": layer["w_down"],
    }
    for name, part in zip("qkv", layer["wqkv"].split([q_rows, kv_rows, kv_rows])):
        out[f"self_attn.{name}_proj.weight"] = part
    if layer.get("bqkv") is not None:
        for name, part in zip("qkv", layer["bqkv"].split([q_rows, kv_rows, kv_rows])):
            out[f"self_attn.{name}_proj.bias"] = part
    if layer.get("q_norm") is not None:
        out["self_attn.q_norm.weight"], out["self_attn.k_norm.weight"] = layer["q_norm"], layer["k_norm"]
    gate, up = layer["w_gate_up"].chunk(2)
    out["mlp.gate_proj.weight"], out["mlp.up_proj.weight"] = gate, up
    dtype = tensors["fc"].dtype
    return {PREFIX + name: t.to(dtype).contiguous() for name, t in out.items()}


def verifier_reference(verifier: str | None, target_name: str | None, target: ModelConfig) -> str:
    """The verifier as config.json names it: a local folder's absolute path (checked against the head's
    target, since speculators reads its embedding and lm_head from there) or a Hugging Face id."""
    name = verifier or target_name
    if not name:
        raise AuguryError("the head does not name its target; give --verifier (a Hugging Face id or a local folder)")
    folder = Path(name).expanduser()
    if not folder.is_dir():
        return name
    try:
        found = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AuguryError(f"verifier folder {folder} has no readable config.json ({exc})") from None
    found = found.get("text_config", found)
    want = {"model_type": MTP_ARCHITECTURES[target.arch][0], "hidden_size": target.hidden_size,
            "vocab_size": target.vocab_size}
    differs = {k: found.get(k) for k, v in want.items() if found.get(k) != v}
    if differs:
        raise AuguryError(f"verifier folder {folder} is not this head's target: it has {differs}, the head {want}")
    return str(folder.resolve())


def export_speculators(head: str | Path, out: str | Path, *, speculative_tokens: int = 3,
                       verifier: str | None = None) -> Exported:
    """Write out/config.json and out/model.safetensors (MTPDraftModel's layout) for a chained head."""
    from safetensors.torch import save

    meta, tensors = read_head(head)
    target_meta = meta.get("target") or {}
    if "config" not in target_meta or "target.final_norm" not in tensors:
        raise AuguryError(f"head {head} lacks the target's config or final norm (written by an older augury train); "
                          "train it again to export it")
    target = ModelConfig(**target_meta["config"])
    reason = refusal(meta, target)
    if reason:
        raise AuguryError(f"cannot export {head}: {reason}")
    if speculative_tokens < 1:
        raise AuguryError(f"speculative tokens must be >= 1, got {speculative_tokens}")
    verifier_name = verifier_reference(verifier, target_meta.get("name"), target)
    weights = speculators_weights(tensors, target)
    intermediate = weights[PREFIX + "mlp.gate_proj.weight"].shape[0]
    trained_vocab = int(tensors["vocab"].numel())
    config = {
        "speculators_model_type": "mtp",
        "architectures": ["MTPDraftModel"],
        "speculators_version": SCHEMA_VERSION,
        "transformer_layer_config": layer_config(target, intermediate),
        "num_nextn_predict_layers": 1,
        "speculators_config": {
            "algorithm": "mtp",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier_name, "architectures": [MTP_ARCHITECTURES[target.arch][1]]},
        },
        "torch_dtype": str(tensors["fc"].dtype).removeprefix("torch."),
        "augury": {
            "kind": meta["kind"], "feature": "final", "vocab": "full (the verifier's; MTP cannot reduce it)",
            "trained_vocab_size": trained_vocab, "target_sha256": target_meta.get("sha256"),
            "alpha": meta.get("alpha"),
        },
    }
    out = Path(out).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "model.safetensors", save(weights, metadata={"format": "pt"}))
        write_atomic(out / "config.json", json.dumps(config, indent=2).encode())
        (out / "draft_vocab.safetensors").unlink(missing_ok=True)  # an earlier export's maps, which nothing reads
    except OSError as exc:
        raise AuguryError(f"writing the export to {out} failed: {exc.strerror or exc}") from None
    return Exported(out / "config.json", target.vocab_size, trained_vocab)
