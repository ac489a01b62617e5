"""A chained head in the speculators layout, for users who outgrow one machine (`vllm serve DIR` on a GPU).

speculators (vLLM's format for draft models, schema as of speculators 0.9)
stores a DeepSeek-style MTP layer, which is exactly augury's chained head:

    mtp_layers.0.hidden_layernorm  <- state_norm       mtp_layers.0.token_layernorm <- token_norm
    mtp_layers.0.input_proj        <- fc, its halves swapped (speculators concatenates [embedding; state])
    mtp_layers.0.self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj, input_layernorm, post_attention_layernorm
                                   <- the head's decoder layer, unfused
    mtp_layers.0.final_layernorm   <- the target's final norm (which the head applies before its output)

config.json carries speculators_model_type "mtp", the layer's transformer
config (the target's, one layer), the greedy proposal with its number of
speculative tokens and the verifier. The embedding and output head are the
verifier's own and are not stored (speculators loads them from the verifier).

What the schema cannot say: speculators' MTP layer drafts over the full
vocabulary, so the head's frequency subset travels next to it as the d2t/t2d
maps speculators uses for reduced vocabularies (draft_vocab.safetensors: d2t
[N] offsets, target id = i + d2t[i]; t2d [V] bool), with draft_vocab_size in
config.json's "augury" block. A parallel head has no speculators form (its
block drafters inject the verifier's context into every draft layer), and
only qwen2/llama layers are written.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from augury.errors import AuguryError
from augury.files import write_atomic
from augury.models.decoder import ModelConfig
from augury.models.head import LAYER_PREFIX
from augury.models.head_file import read_head

SCHEMA_VERSION = "0.9.0"  # the speculators release whose config classes this layout follows
HF_ARCHITECTURES = {"qwen2": ("qwen2", "Qwen2ForCausalLM"), "llama": ("llama", "LlamaForCausalLM")}
PREFIX = "mtp_layers.0."


def layer_config(target: ModelConfig, intermediate_size: int) -> dict:
    """The Hugging Face config of one layer of the target's architecture (speculators' transformer_layer_config)."""
    model_type, architecture = HF_ARCHITECTURES[target.arch]
    config = {
        "model_type": model_type,
        "architectures": [architecture],
        "vocab_size": target.vocab_size,
        "hidden_size": target.hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": target.num_heads,
        "num_key_value_heads": target.num_kv_heads,
        "head_dim": target.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": target.context_length,
        "rms_norm_eps": target.rms_eps,
        "rope_theta": target.rope_theta,
        "tie_word_embeddings": target.tie_embeddings,
    }
    if model_type == "llama":
        config.update(attention_bias=target.qkv_bias, mlp_bias=False)
    return config


def speculators_weights(tensors: dict[str, torch.Tensor], target: ModelConfig) -> dict[str, torch.Tensor]:
    """augury head tensors -> speculators MTP names (unfused q/k/v and gate/up; fc halves swapped)."""
    hidden = target.hidden_size
    q_rows, kv_rows = target.num_heads * target.head_dim, target.num_kv_heads * target.head_dim
    layer = {name[len(LAYER_PREFIX):]: t for name, t in tensors.items() if name.startswith(LAYER_PREFIX)}
    fc = tensors["fc"]
    out = {
        "input_proj.weight": torch.cat([fc[:, hidden:], fc[:, :hidden]], dim=1),
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
    gate, up = layer["w_gate_up"].chunk(2)
    out["mlp.gate_proj.weight"], out["mlp.up_proj.weight"] = gate, up
    dtype = tensors["fc"].dtype
    return {PREFIX + name: t.to(dtype).contiguous() for name, t in out.items()}


def vocab_maps(vocab: torch.Tensor, vocab_size: int) -> dict[str, torch.Tensor]:
    """speculators' reduced-vocabulary maps: d2t [N] (target id = i + d2t[i]) and t2d [V] (in the subset)."""
    vocab = vocab.sort().values.long()
    t2d = torch.zeros(vocab_size, dtype=torch.bool)
    t2d[vocab] = True
    return {"d2t": vocab - torch.arange(vocab.numel()), "t2d": t2d}


def export_speculators(head: str | Path, out: str | Path, *, speculative_tokens: int = 3,
                       verifier: str | None = None) -> Path:
    """Write out/config.json, out/model.safetensors and out/draft_vocab.safetensors; returns out/config.json."""
    from safetensors.torch import save

    meta, tensors = read_head(head)
    if meta["kind"] == "parallel":
        raise AuguryError("a parallel head has no speculators layout (its block drafters inject the verifier's "
                          "context into every draft layer, which this head does not); export an mtp or eagle head")
    target_meta = meta.get("target") or {}
    if "config" not in target_meta or "target.final_norm" not in tensors:
        raise AuguryError(f"head {head} lacks the target's config or final norm (written by an older augury train); "
                          "train it again to export it")
    target = ModelConfig(**target_meta["config"])
    if target.arch not in HF_ARCHITECTURES:
        raise AuguryError(f"exporting a head of a {target.arch} target is not supported "
                          f"(speculators layers written here: {', '.join(sorted(HF_ARCHITECTURES))})")
    if speculative_tokens < 1:
        raise AuguryError(f"speculative tokens must be >= 1, got {speculative_tokens}")
    weights = speculators_weights(tensors, target)
    intermediate = weights[PREFIX + "mlp.gate_proj.weight"].shape[0]
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
            "verifier": {"name_or_path": verifier or target_meta.get("name"),
                         "architectures": [HF_ARCHITECTURES[target.arch][1]]},
        },
        "torch_dtype": str(tensors["fc"].dtype).removeprefix("torch."),
        "augury": {
            "kind": meta["kind"], "feature": meta.get("config", {}).get("feature"),
            "draft_vocab_size": int(tensors["vocab"].numel()), "target_sha256": target_meta.get("sha256"),
            "alpha": meta.get("alpha"),
        },
    }
    out = Path(out).expanduser()
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / "model.safetensors", save(weights, metadata={"format": "pt"}))
        write_atomic(out / "draft_vocab.safetensors", save(vocab_maps(tensors["vocab"], target.vocab_size)))
        write_atomic(out / "config.json", json.dumps(config, indent=2).encode())
    except OSError as exc:
        raise AuguryError(f"writing the export to {out} failed: {exc.strerror or exc}") from None
    return out / "config.json"
