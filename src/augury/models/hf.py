"""Read a Hugging Face model folder: config.json, tokenizer.json, *.safetensors."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors import safe_open

from augury.errors import AuguryError
from augury.models.decoder import ModelConfig
from augury.models.gguf import ARCH_SWITCHES, cast_flat

# Hugging Face model_type -> our architecture name.
MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "gemma3_text": "gemma3", "gemma3": "gemma3"}


def _rope_theta(cfg: dict, layer_type: str) -> tuple[float | None, str]:
    """(rope base, rope type) from either the old flat keys or transformers 5's rope_parameters."""
    params = cfg.get("rope_parameters") or {}
    if layer_type in params:
        params = params[layer_type]
    scaling = cfg.get("rope_scaling") or {}
    theta = params.get("rope_theta", cfg.get("rope_theta"))
    if layer_type == "sliding_attention" and "rope_local_base_freq" in cfg:
        theta = cfg["rope_local_base_freq"]
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    return theta, kind


def read_config(folder: Path) -> ModelConfig:
    """ModelConfig from config.json."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AuguryError(f"{folder}: cannot read config.json: {exc}") from None
    cfg = cfg.get("text_config", cfg)
    model_type = cfg.get("model_type")
    arch = MODEL_TYPES.get(model_type)
    if arch is None:
        raise AuguryError(
            f"{folder}: unsupported model_type '{model_type}' (supported: {', '.join(sorted(MODEL_TYPES))})"
        )
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    switches = dict(ARCH_SWITCHES[arch])
    theta, kind = _rope_theta(cfg, "full_attention")
    if kind != "default":
        raise AuguryError(f"{folder}: rope scaling type '{kind}' is not supported")
    if arch == "gemma3":
        switches["embed_scale"] = math.sqrt(hidden)
        switches["sliding_window"] = cfg.get("sliding_window")
        layer_types = cfg.get("layer_types")
        if layer_types and "full_attention" in layer_types:
            switches["sliding_pattern"] = layer_types.index("full_attention") + 1
        elif "sliding_window_pattern" in cfg:
            switches["sliding_pattern"] = cfg["sliding_window_pattern"]
        switches["rope_theta_local"] = _rope_theta(cfg, "sliding_attention")[0] or 10000.0
        scalar = cfg.get("query_pre_attn_scalar")
        if scalar:
            switches["query_scale"] = scalar**-0.5
        act = cfg.get("hidden_activation") or cfg.get("hidden_act")
        if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
            raise AuguryError(f"{folder}: unsupported activation '{act}'")
    return ModelConfig(
        arch=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=hidden,
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads,
        rms_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=theta or 10000.0,
        context_length=cfg.get("max_position_embeddings", 4096),
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        **switches,
    )


def read_tokenizer(folder: Path):
    """tokenizer.json plus the special tokens and chat template from tokenizer_config.json."""
    from tokenizers import Tokenizer as HFTokenizer

    from augury.models.tokenizer import Tokenizer, TokenizerMeta

    path = folder / "tokenizer.json"
    if not path.exists():
        raise AuguryError(f"{folder}: no tokenizer.json")
    config_path = folder / "tokenizer_config.json"
    tok_cfg = json.loads(config_path.read_text()) if config_path.exists() else {}

    def text(value):
        return value.get("content") if isinstance(value, dict) else value

    template = tok_cfg.get("chat_template")
    template_file = folder / "chat_template.jinja"
    if template is None and template_file.exists():
        template = template_file.read_text()
    meta = TokenizerMeta(
        bos_token=text(tok_cfg.get("bos_token")),
        eos_token=text(tok_cfg.get("eos_token")),
        add_bos=bool(tok_cfg.get("add_bos_token", False)),
        chat_template=template if isinstance(template, str) else None,
    )
    return Tokenizer(HFTokenizer.from_file(str(path)), meta)


def read_weights(folder: Path, config: ModelConfig, dtype: torch.dtype) -> dict:
    """All *.safetensors in the folder, renamed to augury's flat naming and fused."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise AuguryError(f"{folder}: no *.safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as fh:
            for key in fh.keys():
                name = key.removeprefix("model.language_model.").removeprefix("model.")
                tensors[name] = fh.get_tensor(key).float()
    # gemma keeps norm weights as w in x * (1 + w); we store the full multiplier.
    norm_shift = 1.0 if config.arch == "gemma3" else 0.0
    pre_mlp = "pre_feedforward_layernorm" if config.post_norms else "post_attention_layernorm"
    flat = {"embed": tensors["embed_tokens.weight"], "final_norm": tensors["norm.weight"] + norm_shift}
    if not config.tie_embeddings:
        flat["lm_head"] = tensors["lm_head.weight"]
    for i in range(config.num_layers):
        p, out = f"layers.{i}.", f"layers.{i}."
        attn = p + "self_attn."
        flat[out + "attn_norm"] = tensors[p + "input_layernorm.weight"] + norm_shift
        flat[out + "mlp_norm"] = tensors[p + pre_mlp + ".weight"] + norm_shift
        flat[out + "wqkv"] = torch.cat([tensors[attn + f"{n}_proj.weight"] for n in "qkv"])
        if attn + "q_proj.bias" in tensors:
            flat[out + "bqkv"] = torch.cat([tensors[attn + f"{n}_proj.bias"] for n in "qkv"])
        flat[out + "wo"] = tensors[attn + "o_proj.weight"]
        mlp = p + "mlp."
        flat[out + "w_gate_up"] = torch.cat([tensors[mlp + "gate_proj.weight"], tensors[mlp + "up_proj.weight"]])
        flat[out + "w_down"] = tensors[mlp + "down_proj.weight"]
        if config.qk_norm:
            flat[out + "q_norm"] = tensors[attn + "q_norm.weight"] + norm_shift
            flat[out + "k_norm"] = tensors[attn + "k_norm.weight"] + norm_shift
        if config.post_norms:
            flat[out + "post_attn_norm"] = tensors[p + "post_attention_layernorm.weight"] + norm_shift
            flat[out + "post_mlp_norm"] = tensors[p + "post_feedforward_layernorm.weight"] + norm_shift
    return cast_flat(flat, dtype)
