"""Read a Hugging Face model folder: config.json, tokenizer.json, *.safetensors."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from augury.errors import AuguryError
from augury.models.decoder import ModelConfig
from augury.models.families import BY_HF_TYPE, Family, embed_scale, family, rope_scaling, sliding_from_layer_types
from augury.models.gguf import cast_flat


def _rope(cfg: dict, layer_type: str) -> tuple[float | None, str, dict]:
    """(rope base, rope type, its parameters) from the old flat keys or transformers 5's rope_parameters."""
    params = cfg.get("rope_parameters") or {}
    if layer_type in params:
        params = params[layer_type]
    params = {**(cfg.get("rope_scaling") or {}), **params}
    theta = params.get("rope_theta", cfg.get("rope_theta"))
    if layer_type == "sliding_attention" and "rope_local_base_freq" in cfg:
        theta = cfg["rope_local_base_freq"]
    kind = params.get("rope_type") or params.get("type") or "default"
    return theta, kind, params


def _sliding(cfg: dict, fam: Family, where: str) -> dict:
    """The sliding-window switches: from layer_types where given, else the family's pattern (gemma's older
    configs), else a window on every layer (mistral, phi-3)."""
    window = cfg.get("sliding_window")
    if not window or cfg.get("use_sliding_window") is False:  # qwen2/3 name a window they do not use
        return {}
    layer_types = cfg.get("layer_types")
    if layer_types:
        pattern = sliding_from_layer_types(layer_types, where)
    else:
        pattern = cfg.get("sliding_window_pattern", fam.sliding_pattern)
    return {} if pattern is None else {"sliding_window": window, "sliding_pattern": pattern}


def read_config(folder: Path) -> ModelConfig:
    """ModelConfig from config.json."""
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise AuguryError(f"{folder}: cannot read config.json: {exc}") from None
    if isinstance(cfg, dict):
        cfg = cfg.get("text_config", cfg)
    if not isinstance(cfg, dict):
        raise AuguryError(f"{folder}: config.json is not a JSON object of settings")
    try:
        return _config_from(cfg, folder)
    except KeyError as exc:
        raise AuguryError(f"{folder}: config.json has no {exc.args[0]!r}") from None
    except (TypeError, ValueError, ArithmeticError, AttributeError) as exc:
        raise AuguryError(f"{folder}: config.json holds a setting of the wrong kind ({exc})") from None


def _config_from(cfg: dict, folder: Path) -> ModelConfig:
    """ModelConfig from config.json's settings (a KeyError or TypeError: a missing or mistyped one)."""
    where = f"{folder}: "
    model_type = cfg.get("model_type")
    fam = BY_HF_TYPE.get(model_type)
    if fam is None:
        raise AuguryError(
            f"{where}unsupported model_type '{model_type}' (supported: {', '.join(sorted(BY_HF_TYPE))}; "
            "see `augury models list`)"
        )
    hidden, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads
    switches = {**fam.switches, **_sliding(cfg, fam, where)}
    theta, kind, params = _rope(cfg, "full_attention")
    theta = theta or 10000.0
    if float(params.get("partial_rotary_factor") or cfg.get("partial_rotary_factor") or 1.0) != 1.0:
        raise AuguryError(f"{where}partial rotary embeddings (partial_rotary_factor < 1) are not supported")
    context = cfg.get("max_position_embeddings", 4096)
    if "original_max_position_embeddings" in cfg:  # Phi-3 keeps it beside rope_scaling; transformers prefers it
        params = {**params, "original_max_position_embeddings": cfg["original_max_position_embeddings"]}
    factors, attn_factor = rope_scaling(kind, head_dim, theta, params, context, where)
    if "rope_theta_local" in switches:
        switches["rope_theta_local"] = _rope(cfg, "sliding_attention")[0] or switches["rope_theta_local"]
    scalar = cfg.get("query_pre_attn_scalar")
    if scalar:
        switches["query_scale"] = scalar**-0.5
    act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
    if {"gelu_pytorch_tanh": "gelu_tanh"}.get(act, act) != switches.get("activation", "silu"):
        raise AuguryError(f"{where}unsupported activation '{act}' for a {fam.name} model")
    return ModelConfig(
        arch=fam.name,
        vocab_size=cfg["vocab_size"],
        hidden_size=hidden,
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim,
        rms_eps=cfg.get("rms_norm_eps", 1e-6),
        rope_theta=theta,
        context_length=context,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        embed_scale=embed_scale(fam, hidden),
        rope_freq_factors=factors,
        rope_attn_factor=attn_factor,
        attn_softcap=cfg.get("attn_logit_softcapping"),
        final_softcap=cfg.get("final_logit_softcapping"),
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


class _Tensors(dict):
    """A model's tensors by name; a missing one is one clear error naming it, not a KeyError."""

    def __init__(self, where: Path) -> None:
        super().__init__()
        self.where = where

    def __missing__(self, name: str):
        raise AuguryError(f"{self.where}: tensor {name} is missing from the *.safetensors files")


def read_weights(folder: Path, config: ModelConfig, dtype: torch.dtype) -> dict:
    """All *.safetensors in the folder, renamed to augury's flat naming and fused (Phi-3's are already fused)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise AuguryError(f"{folder}: no *.safetensors files")
    tensors = _Tensors(folder)
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as fh:
                for key in fh.keys():
                    name = key.removeprefix("model.language_model.").removeprefix("model.")
                    tensors[name] = fh.get_tensor(key).float()
        except SafetensorError as exc:
            raise AuguryError(f"{file}: not a readable safetensors file ({exc})") from None
    fam = family(config.arch)
    # gemma keeps norm weights as w in x * (1 + w); we store the full multiplier.
    norm_shift = 1.0 if fam.norm_plus_one else 0.0
    pre_mlp = "pre_feedforward_layernorm" if config.post_norms else "post_attention_layernorm"
    flat = {"embed": tensors["embed_tokens.weight"], "final_norm": tensors["norm.weight"] + norm_shift}
    if not config.tie_embeddings:
        flat["lm_head"] = tensors["lm_head.weight"]
    for i in range(config.num_layers):
        p, out = f"layers.{i}.", f"layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        flat[out + "attn_norm"] = tensors[p + "input_layernorm.weight"] + norm_shift
        flat[out + "mlp_norm"] = tensors[p + pre_mlp + ".weight"] + norm_shift
        if fam.fused_qkv:
            flat[out + "wqkv"] = tensors[attn + "qkv_proj.weight"]
        else:
            flat[out + "wqkv"] = torch.cat([tensors[attn + f"{n}_proj.weight"] for n in "qkv"])
        if config.qkv_bias:
            flat[out + "bqkv"] = torch.cat([tensors[attn + f"{n}_proj.bias"] for n in "qkv"])
        flat[out + "wo"] = tensors[attn + "o_proj.weight"]
        if fam.fused_gate_up:
            flat[out + "w_gate_up"] = tensors[mlp + "gate_up_proj.weight"]
        else:
            flat[out + "w_gate_up"] = torch.cat([tensors[mlp + "gate_proj.weight"], tensors[mlp + "up_proj.weight"]])
        flat[out + "w_down"] = tensors[mlp + "down_proj.weight"]
        if config.qk_norm:
            flat[out + "q_norm"] = tensors[attn + "q_norm.weight"] + norm_shift
            flat[out + "k_norm"] = tensors[attn + "k_norm.weight"] + norm_shift
        if config.post_norms:
            flat[out + "post_attn_norm"] = tensors[p + "post_attention_layernorm.weight"] + norm_shift
            flat[out + "post_mlp_norm"] = tensors[p + "post_feedforward_layernorm.weight"] + norm_shift
    return cast_flat(flat, dtype)
