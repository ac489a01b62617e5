"""Read a GGUF file: config, tokenizer and weights dequantized to torch tensors.

GGUF keeps weights in llama.cpp's layout: [out, in] matrices, llama's q/k rows
permuted for interleaved rotary, gemma's norm weights stored as 1 + w. We
convert once to augury's layout (half-split rotary, fused qkv and gate/up, norm
weights as full multipliers) and the loader caches the result.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from augury.errors import AuguryError
from augury.models.decoder import ModelConfig
from augury.models.families import Family, embed_scale, family, rope_scaling, sliding_from_layer_types

# Quantization types we dequantize (through the gguf package's reference code).
SUPPORTED_QUANTS = frozenset(
    {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
)

def open_gguf(path: Path):
    """A GGUFReader, or an AuguryError naming the file if it is not a readable GGUF."""
    import gguf

    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise AuguryError(f"cannot read {path}: {exc.strerror}") from None
    if magic != b"GGUF":
        raise AuguryError(f"{path} is not a GGUF file (bad magic bytes)")
    try:
        return gguf.GGUFReader(str(path))
    except Exception as exc:  # the reader raises assorted errors on truncated files
        raise AuguryError(f"{path} is truncated or corrupt: {type(exc).__name__}: {exc}") from None


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    return value


def read_config(reader, path: Path) -> ModelConfig:
    """ModelConfig from GGUF metadata (and the rope_freqs tensor); unsupported architectures are refused by name."""
    arch = _field(reader, "general.architecture")
    fam = family(arch, f"{path}: ")

    def need(key: str):
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise AuguryError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    def maybe(key: str, default=None):
        return _field(reader, f"{arch}.{key}", default)

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    head_dim = int(maybe("attention.key_length", hidden // heads))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else int(need("vocab_size"))
    switches = dict(fam.switches)
    window = maybe("attention.sliding_window", fam.default_window)
    if window:
        switches.update(sliding_window=int(window), sliding_pattern=fam.sliding_pattern)
    theta = float(maybe("rope.freq_base", 10000.0))
    rotary = int(maybe("rope.dimension_count", head_dim))
    if rotary != head_dim:
        raise AuguryError(f"{path}: partial rotary embeddings ({rotary} of {head_dim} dims) are not supported")
    tensors = {t.name: t for t in reader.tensors}
    context = int(need("context_length"))
    if "rope_factors_long.weight" in tensors or "rope_factors_short.weight" in tensors:
        # Phi-3's longrope as llama.cpp's converter stores it: both divisor sets as tensors, the pretraining
        # length and the attention factor as metadata (llama.cpp reads a missing factor as 1)
        params = {f"{n}_factor": tuple(float(f) for f in _dequantized(tensors[f"rope_factors_{n}.weight"], None, path))
                  for n in ("short", "long") if f"rope_factors_{n}.weight" in tensors}
        params["original_max_position_embeddings"] = int(maybe("rope.scaling.original_context_length", context))
        params["attention_factor"] = float(maybe("rope.scaling.attn_factor", 1.0))
        factors, attn_factor = rope_scaling("longrope", head_dim, theta, params, context, f"{path}: ")
    elif "rope_freqs.weight" in tensors:  # llama3 scaling as llama.cpp's converter stores it: a divisor per frequency
        factors = tuple(float(f) for f in _dequantized(tensors["rope_freqs.weight"], None, path).flatten())
        attn_factor = 1.0
    else:
        kind = str(maybe("rope.scaling.type", "none"))
        factors, attn_factor = rope_scaling(kind, head_dim, theta, {"factor": maybe("rope.scaling.factor", 1.0)},
                                            context, f"{path}: ")
    pattern = maybe("attention.sliding_window_pattern")
    if window and isinstance(pattern, list):  # newer files list which layers slide
        layer_types = ["sliding_attention" if slides else "full_attention" for slides in pattern]
        switches["sliding_pattern"] = sliding_from_layer_types(layer_types, f"{path}: ") or 0
    optional = {
        "query_scale": maybe("attention.scale"),
        "attn_softcap": maybe("attn_logit_softcapping"),
        "final_softcap": maybe("final_logit_softcapping"),
    }
    config = ModelConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=int(maybe("attention.head_count_kv", heads)),
        head_dim=head_dim,
        rms_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope_theta=theta,
        context_length=context,
        tie_embeddings="output.weight" not in tensors,
        embed_scale=embed_scale(fam, hidden),
        rope_freq_factors=factors,
        rope_attn_factor=attn_factor,
        **{name: float(value) for name, value in optional.items() if value},
        **switches,
    )
    _check_tensors(reader, config, path)  # before any weight is read (or a progress bar drawn)
    return config


def read_tokenizer(path: Path):
    """The model's tokenizer, built from GGUF metadata (vocabulary, merges, specials, template).

    transformers keeps these helpers where they are from 5.18 on; older releases had other ones, and
    5.17's public GGUF loading built a different tokenizer for Qwen2 (an invented `</s>` as end of
    sequence), so an older release is refused by name rather than worked around (docs/benchmarks.md 21a).
    """
    try:
        from transformers.integrations.gguf.gguf_tokenizer_mapping import (
            convert_gguf_tokenizer,
            get_gguf_tokenizer,
        )
    except ImportError:
        import transformers

        raise AuguryError(f"reading a GGUF file's tokenizer needs transformers >= 5.18, not "
                          f"{transformers.__version__}: pip install 'transformers>=5.18,<6'") from None

    from augury.models.tokenizer import Tokenizer, TokenizerMeta

    try:
        arch, tokenizer_dict, tokenizer_config = get_gguf_tokenizer(str(path))
        backend, _ = convert_gguf_tokenizer(arch, tokenizer_dict)
    except Exception as exc:
        raise AuguryError(f"{path}: cannot build its tokenizer: {type(exc).__name__}: {exc}") from None
    meta = TokenizerMeta(
        bos_token=tokenizer_config.get("bos_token"),
        eos_token=tokenizer_config.get("eos_token"),
        add_bos=bool(tokenizer_config.get("add_bos_token", False)),
        chat_template=tokenizer_config.get("chat_template"),
    )
    return Tokenizer(backend, meta)


def _unpermute_rotary(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's q/k row permutation (interleaved rotary -> half-split rotary).

    weight: [num_heads * D, in] (or a bias [num_heads * D]).
    """
    rows = weight.shape[0]
    rest = weight.shape[1:]
    half = rows // num_heads // 2
    return weight.reshape(num_heads, half, 2, *rest).transpose(1, 2).reshape(rows, *rest)


def linear_parts(fam: Family) -> dict[str, tuple[str, ...]]:
    """augury's fused matmul weights and the GGUF tensors stacked (on the output axis) into each.

    Phi-3's files hold q/k/v as one `attn_qkv` and gate/up as one `ffn_up` of
    2 I rows (gate first), already the fused layout; the others stack parts.
    """
    return {
        "wqkv": ("attn_qkv",) if fam.fused_qkv else ("attn_q", "attn_k", "attn_v"),
        "wo": ("attn_output",),
        "w_gate_up": ("ffn_up",) if fam.fused_gate_up else ("ffn_gate", "ffn_up"),
        "w_down": ("ffn_down",),
    }


# augury's per-layer norms and their GGUF tensor names.
GGUF_NORMS = {
    "attn_norm": "attn_norm.weight",
    "mlp_norm": "ffn_norm.weight",
    "q_norm": "attn_q_norm.weight",
    "k_norm": "attn_k_norm.weight",
    "post_attn_norm": "post_attention_norm.weight",
    "post_mlp_norm": "post_ffw_norm.weight",
}


def required_tensors(config: ModelConfig) -> list[str]:
    """Every tensor a GGUF of this config must hold (the rest, such as rope_freqs, are optional)."""
    fam = family(config.arch)
    names = ["token_embd.weight", "output_norm.weight"] + ([] if config.tie_embeddings else ["output.weight"])
    norms = ["attn_norm", "mlp_norm"] + ["q_norm", "k_norm"] * config.qk_norm
    norms += ["post_attn_norm", "post_mlp_norm"] * config.post_norms
    for i in range(config.num_layers):
        p = f"blk.{i}."
        names += [p + part + ".weight" for parts in linear_parts(fam).values() for part in parts]
        names += [p + GGUF_NORMS[n] for n in norms]
        names += [p + f"attn_{n}.bias" for n in "qkv"] * config.qkv_bias
    return names


def _check_tensors(reader, config: ModelConfig, path: Path) -> None:
    """One AuguryError naming the first tensor augury needs but the file lacks, or cannot read at all."""
    present = {t.name for t in reader.tensors}
    missing = [name for name in required_tensors(config) if name not in present]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise AuguryError(f"{path}: tensor {missing[0]}{more} is missing, which a {config.arch} model needs")
    for t in reader.tensors:
        if t.tensor_type.name not in SUPPORTED_QUANTS:
            raise AuguryError(
                f"{path}: tensor {t.name} uses quantization type {t.tensor_type.name}, which augury does not support "
                f"(supported: {', '.join(sorted(SUPPORTED_QUANTS))})"
            )


def _rotary_heads(name: str, config: ModelConfig | None) -> int | None:
    """For q/k tensors llama.cpp permuted (llama layout), the head count whose row permutation must be undone."""
    if config is None or not family(config.arch).gguf_rotary_permuted:
        return None
    if name.endswith(("attn_q.weight", "attn_q.bias")):
        return config.num_heads
    if name.endswith(("attn_k.weight", "attn_k.bias")):
        return config.num_kv_heads
    return None


def _dequantized(t, config: ModelConfig | None, path: Path) -> torch.Tensor:
    """One GGUF tensor as fp32 in augury's layout (llama's q/k rows un-permuted)."""
    import gguf

    try:
        array = gguf.quants.dequantize(t.data, t.tensor_type)
    except Exception as exc:
        raise AuguryError(f"{path}: cannot dequantize {t.name} ({t.tensor_type.name}): {exc}") from None
    tensor = torch.from_numpy(np.require(array, np.float32, ["C", "W"]))
    heads = _rotary_heads(t.name, config)
    return tensor if heads is None else _unpermute_rotary(tensor, heads)


def read_weights(reader, config: ModelConfig, path: Path, dtype: torch.dtype, progress: Callable | None = None) -> dict:
    """Dequantize every tensor to `dtype` in augury's flat naming (see `weights_from_flat`)."""
    tensors = {}
    for t in reader.tensors:
        tensors[t.name] = _dequantized(t, config, path)
        if progress is not None:
            progress(int(t.n_bytes))
    return gguf_to_flat(tensors, config, dtype)


def read_native_weights(
    reader,
    config: ModelConfig,
    path: Path,
    dtype: torch.dtype,
    progress: Callable | None = None,
    warn: Callable[[str], None] | None = None,
) -> dict:
    """Like `read_weights`, but matmul weights stay GGUF blocks (`GgufWeight`) where the kernel covers their type.

    Fusing q/k/v and gate/up stacks whole rows of blocks (blocks run along the
    input axis), and llama's rotary un-permutation moves whole rows too, so the
    blocks need no re-quantization. A fused weight with a part of another
    block type (F16, Q2_K, ...) is dequantized to `dtype` as `read_weights`
    does, with one `warn` line per such tensor. The token embedding is always a
    dequantized `dtype` copy (lookups need rows, not matmuls); with tied
    embeddings the output head still multiplies the native blocks.
    """
    from augury.kernels.reference import KINDS
    from augury.kernels.weight import GgufWeight

    by_name = {t.name: t for t in reader.tensors}

    def done(t) -> None:
        if progress is not None:
            progress(int(t.n_bytes))

    def blocks(t) -> torch.Tensor:
        raw = torch.from_numpy(np.array(t.data, dtype=np.uint8, copy=True))  # [rows, row_bytes]
        heads = _rotary_heads(t.name, config)
        return raw if heads is None else _unpermute_rotary(raw, heads)

    def native(names: list[str]) -> GgufWeight | torch.Tensor:
        ts = [by_name[n] for n in names]
        odd = [t for t in ts if t.tensor_type.name not in KINDS]
        if not odd:
            weight = GgufWeight([(t.tensor_type.name, blocks(t)) for t in ts], dtype=dtype)
        else:
            for t in odd:
                if warn is not None:
                    warn(
                        f"{path.name}: {t.name} is {t.tensor_type.name}, which the GGUF kernel does not cover; "
                        f"using a dequantized {str(dtype).removeprefix('torch.')} copy"
                    )
            weight = torch.cat([_dequantized(t, config, path) for t in ts]).to(dtype).contiguous()
        for t in ts:
            done(t)
        return weight

    used: set[str] = set()
    flat: dict = {}
    for i in range(config.num_layers):
        for ours, theirs in linear_parts(family(config.arch)).items():
            names = [f"blk.{i}.{n}.weight" for n in theirs]
            flat[f"layers.{i}.{ours}"] = native(names)
            used.update(names)
    head = "token_embd.weight" if config.tie_embeddings else "output.weight"
    flat["lm_head"] = native([head])
    used.add(head)
    rest = {}
    for t in reader.tensors:
        if t.name not in used or t.name == "token_embd.weight":
            rest[t.name] = _dequantized(t, config, path)
            if t.name not in used:
                done(t)
    for i in range(config.num_layers):
        p = f"blk.{i}."
        for ours, theirs in GGUF_NORMS.items():
            if p + theirs in rest:
                flat[f"layers.{i}.{ours}"] = rest[p + theirs]
        if p + "attn_q.bias" in rest:
            flat[f"layers.{i}.bqkv"] = torch.cat([rest[p + f"attn_{n}.bias"] for n in "qkv"])
    flat["embed"] = rest["token_embd.weight"]
    flat["final_norm"] = rest["output_norm.weight"]
    plain = cast_flat({k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}, dtype)
    return {**flat, **plain}


def gguf_to_flat(tensors: dict[str, torch.Tensor], config: ModelConfig, dtype: torch.dtype) -> dict:
    """GGUF tensor names -> augury's flat names, fusing q/k/v and gate/up where the file keeps them apart."""
    flat = {
        "embed": tensors["token_embd.weight"],
        "final_norm": tensors["output_norm.weight"],
    }
    if not config.tie_embeddings:
        flat["lm_head"] = tensors["output.weight"]
    parts = linear_parts(family(config.arch))
    for i in range(config.num_layers):
        p = f"blk.{i}."
        for ours, theirs in GGUF_NORMS.items():
            if p + theirs in tensors:
                flat[f"layers.{i}.{ours}"] = tensors[p + theirs]
        for ours, theirs in parts.items():
            flat[f"layers.{i}.{ours}"] = torch.cat([tensors[p + n + ".weight"] for n in theirs])
        if p + "attn_q.bias" in tensors:
            flat[f"layers.{i}.bqkv"] = torch.cat([tensors[p + f"attn_{n}.bias"] for n in "qkv"])
    return cast_flat(flat, dtype)


def cast_flat(flat: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Matrices and biases to the compute dtype; norm weights stay fp32 (norms run in fp32)."""
    return {
        name: tensor.to(torch.float32 if name.endswith("norm") else dtype).contiguous()
        for name, tensor in flat.items()
    }
