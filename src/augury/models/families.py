"""The model families augury loads, as data: what each one switches on in the one decoder.

A family is a GGUF `general.architecture` name and the Hugging Face `model_type`s
that mean the same layers. Everything that differs between them is a flag here
or a value read from the file (rope base, windows, soft-caps), so the decoder,
the GGUF reader and the HF reader never branch on a family's name, and
`augury models list` prints the same table the loaders use.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from augury.errors import AuguryError


@dataclass(frozen=True)
class Family:
    """One architecture's fixed traits (those its files do not spell out; llama.cpp hard-codes them too)."""

    name: str  # GGUF general.architecture, and ModelConfig.arch
    hf_types: tuple[str, ...]  # config.json model_type values loaded as this family
    switches: dict = field(default_factory=dict)  # ModelConfig fields the family fixes
    norm_plus_one: bool = False  # HF stores norm weights as w in x * (1 + w) (GGUF files already hold 1 + w)
    embed_scaled: bool = False  # embeddings are multiplied by sqrt(hidden_size)
    gguf_rotary_permuted: bool = False  # llama.cpp's converter permutes q/k rows for interleaved rotary
    fused_qkv: bool = False  # q, k, v stored as one tensor (HF qkv_proj, GGUF attn_qkv)
    fused_gate_up: bool = False  # gate and up stored as one tensor (HF gate_up_proj, GGUF ffn_up of 2 I rows)
    sliding_pattern: int = 0  # GGUF: every n-th layer is global, the rest slide (0: all layers alike)
    default_window: int | None = None  # GGUF: the sliding window when the file does not say
    native_layer: str = "yes"  # for `augury models list`: whether GGUF blocks run the C++ layer (the decoder
    # decides from the loaded config; this says what that decision is for the family's files)
    notes: str = ""  # what the README table says about it


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama", "mistral"), gguf_rotary_permuted=True,
           notes="Llama 2/3.x (llama3 RoPE scaling), Mistral (sliding window from config.json)"),
    Family("qwen2", ("qwen2",), {"qkv_bias": True}, notes="Qwen2, Qwen2.5"),
    Family("qwen3", ("qwen3",), {"qk_norm": True}, notes="Qwen3 dense (per-head q/k RMSNorm)"),
    Family("phi3", ("phi3",), fused_qkv=True, fused_gate_up=True,
           notes="Phi-3/3.5 (4k plain RoPE; 128k longrope, its factors chosen by context), fused qkv, gate/up"),
    Family("gemma2", ("gemma2",), {"post_norms": True, "activation": "gelu_tanh"}, norm_plus_one=True,
           embed_scaled=True, sliding_pattern=2, default_window=4096,
           native_layer="no: soft-caps (torch layer)",
           notes="Gemma 2 (attention and final-logit soft-caps, alternating windows)"),
    Family("gemma3", ("gemma3_text", "gemma3"),
           {"qk_norm": True, "post_norms": True, "activation": "gelu_tanh", "rope_theta_local": 10000.0},
           norm_plus_one=True, embed_scaled=True, sliding_pattern=6, default_window=512,
           notes="Gemma 3 text (local/global RoPE bases, 5:1 sliding windows)"),
)

BY_NAME = {f.name: f for f in FAMILIES}
BY_HF_TYPE = {t: f for f in FAMILIES for t in f.hf_types}


def family(name: str, where: str = "") -> Family:
    """The family of a GGUF architecture name, or one clear error naming the ones there are."""
    found = BY_NAME.get(name)
    if found is None:
        raise AuguryError(f"{where}unsupported architecture '{name}': augury has no decoder for it "
                          f"(supported: {', '.join(sorted(BY_NAME))}; see `augury models list`)")
    return found


def embed_scale(fam: Family, hidden: int) -> float:
    return math.sqrt(hidden) if fam.embed_scaled else 1.0


def sliding_from_layer_types(layer_types: list[str], where: str) -> int | None:
    """ModelConfig.sliding_pattern from HF `layer_types`: None if no layer slides, 0 if all do,
    p if every p-th layer is global; anything else is refused (the decoder has no per-layer list)."""
    sliding = [kind == "sliding_attention" for kind in layer_types]
    if not any(sliding):
        return None
    if all(sliding):
        return 0
    period = sliding.index(False) + 1
    if any(s != (i % period != period - 1) for i, s in enumerate(sliding)):
        raise AuguryError(f"{where}sliding-window layers in an irregular order ({layer_types}) are not supported")
    return period


def llama3_factors(head_dim: int, theta: float, params: dict) -> tuple[float, ...]:
    """The divisor of each rotary frequency under Llama 3's `llama3` scaling.

    Low frequencies (long wavelengths) are slowed by `factor`, high ones kept,
    and those between blended smoothly; this is the same per-frequency divisor
    llama.cpp's converter stores as the GGUF's `rope_freqs` tensor, so both
    loaders share one representation (ModelConfig.rope_freq_factors).
    """
    factor = float(params["factor"])
    low, high = float(params.get("low_freq_factor", 1.0)), float(params.get("high_freq_factor", 4.0))
    original = float(params["original_max_position_embeddings"])
    low_wavelen, high_wavelen = original / low, original / high
    factors = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * theta ** (i / head_dim)
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            factors.append(1.0 / ((1 - smooth) / factor + smooth))
    return tuple(factors)


def longrope_factors(head_dim: int, params: dict, context: int, where: str) -> tuple[tuple[float, ...], float]:
    """Phi-3's `longrope` ('su') scaling: (the chosen per-frequency divisors, the factor on cos and sin).

    transformers switches between the short and the long divisors by the current
    sequence length; augury's KV cache holds keys already rotated, so a switch
    mid-sequence would leave the cached keys on the other frequencies. The set is
    chosen once, by the context the model is loaded with, as llama.cpp does: the
    long divisors past original_max_position_embeddings, else the short ones. The
    attention factor is the config's, else sqrt(1 + ln(s) / ln(original)) with
    s = context / original (1 where s <= 1), transformers' and llama.cpp's default.
    """
    original = params.get("original_max_position_embeddings")
    if not isinstance(original, int) or original <= 0:
        raise AuguryError(f"{where}longrope scaling needs a positive original_max_position_embeddings, "
                          f"not {original!r}")
    chosen = {}
    for name in ("short_factor", "long_factor"):
        values = params.get(name)
        if not isinstance(values, (list, tuple)) or len(values) != head_dim // 2 or not all(
            isinstance(v, (int, float)) and v > 0 for v in values
        ):
            raise AuguryError(f"{where}longrope {name} must be {head_dim // 2} positive numbers (one per rotary "
                              f"frequency), not {str(values)[:60]}")
        chosen[name] = tuple(float(v) for v in values)
    scale = float(params.get("factor") or context / original)
    attention = params.get("attention_factor")
    if attention is None:
        attention = math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0
    return chosen["long_factor" if context > original else "short_factor"], float(attention)


def rope_scaling(
    kind: str, head_dim: int, theta: float, params: dict, context: int, where: str
) -> tuple[tuple[float, ...] | None, float]:
    """(per-frequency divisors, None if unscaled; the factor on cos and sin) for a RoPE scaling type, or one
    clear refusal naming it. context: the length the model is loaded for (longrope picks its divisors by it)."""
    if kind in ("longrope", "su"):
        return longrope_factors(head_dim, params, context, where)
    return rope_factors(kind, head_dim, theta, params, where), 1.0


def rope_factors(kind: str, head_dim: int, theta: float, params: dict, where: str) -> tuple[float, ...] | None:
    """Per-frequency divisors for a RoPE scaling type (None: unscaled), or one clear refusal naming it."""
    if kind in ("default", "none", ""):
        return None
    if kind == "linear":
        return (float(params["factor"]),) * (head_dim // 2)
    if kind == "llama3":
        return llama3_factors(head_dim, theta, params)
    raise AuguryError(f"{where}rope scaling type '{kind}' is not supported (supported: linear, llama3, longrope)")
