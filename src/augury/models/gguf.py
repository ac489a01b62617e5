"""Read a GGUF file: config, tokenizer and weights dequantized to torch tensors.

GGUF keeps weights in llama.cpp's layout: [out, in] matrices, llama's q/k rows
permuted for interleaved rotary, gemma's norm weights stored as 1 + w. We
convert once to augury's layout (half-split rotary, fused qkv and gate/up, norm
weights as full multipliers) and the loader caches the result.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from augury.errors import AuguryError
from augury.models.decoder import ModelConfig

# Quantization types we dequantize (through the gguf package's reference code).
SUPPORTED_QUANTS = frozenset(
    {"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"}
)

# Per-architecture switches that GGUF metadata does not spell out (llama.cpp
# hard-codes them per architecture too).
ARCH_SWITCHES: dict[str, dict] = {
    "llama": {},
    "qwen2": {"qkv_bias": True},
    "gemma3": {
        "qk_norm": True,
        "post_norms": True,
        "activation": "gelu_tanh",
        "sliding_pattern": 6,
        "rope_theta_local": 10000.0,
    },
}


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
    """ModelConfig from GGUF metadata; unsupported architectures are refused by name."""
    arch = _field(reader, "general.architecture")
    if arch not in ARCH_SWITCHES:
        raise AuguryError(
            f"{path}: unsupported architecture '{arch}' (supported: {', '.join(sorted(ARCH_SWITCHES))})"
        )

    def need(key: str):
        value = _field(reader, f"{arch}.{key}")
        if value is None:
            raise AuguryError(f"{path}: GGUF metadata lacks {arch}.{key}")
        return value

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = len(tokens.data) if tokens is not None else int(need("vocab_size"))
    switches = dict(ARCH_SWITCHES[arch])
    if arch == "gemma3":
        switches["embed_scale"] = math.sqrt(hidden)
        switches["sliding_window"] = int(_field(reader, f"{arch}.attention.sliding_window", 512))
    names = {t.name for t in reader.tensors}
    return ModelConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_layers=int(need("block_count")),
        num_heads=heads,
        num_kv_heads=int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(_field(reader, f"{arch}.attention.key_length", hidden // heads)),
        rms_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        context_length=int(need("context_length")),
        tie_embeddings="output.weight" not in names,
        **switches,
    )


def read_tokenizer(path: Path):
    """The model's tokenizer, built from GGUF metadata (vocabulary, merges, specials, template)."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import (
        convert_gguf_tokenizer,
        get_gguf_tokenizer,
    )

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


def _check_types(reader, path: Path) -> None:
    """An AuguryError naming the first tensor whose quantization type augury cannot read at all."""
    for t in reader.tensors:
        if t.tensor_type.name not in SUPPORTED_QUANTS:
            raise AuguryError(
                f"{path}: tensor {t.name} uses quantization type {t.tensor_type.name}, which augury does not support "
                f"(supported: {', '.join(sorted(SUPPORTED_QUANTS))})"
            )


def _rotary_heads(name: str, config: ModelConfig) -> int | None:
    """For llama's q/k tensors, the head count whose rotary row permutation must be undone; else None."""
    if config.arch != "llama":
        return None
    if name.endswith(("attn_q.weight", "attn_q.bias")):
        return config.num_heads
    if name.endswith(("attn_k.weight", "attn_k.bias")):
        return config.num_kv_heads
    return None


def _dequantized(t, config: ModelConfig, path: Path) -> torch.Tensor:
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
    _check_types(reader, path)
    tensors = {}
    for t in reader.tensors:
        tensors[t.name] = _dequantized(t, config, path)
        if progress is not None:
            progress(int(t.n_bytes))
    return gguf_to_flat(tensors, config, dtype)


# augury's fused matmul weights and the GGUF tensors stacked (on the output axis) into each.
NATIVE_LINEARS = {
    "wqkv": ("attn_q", "attn_k", "attn_v"),
    "wo": ("attn_output",),
    "w_gate_up": ("ffn_gate", "ffn_up"),
    "w_down": ("ffn_down",),
}


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

    _check_types(reader, path)
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
        for ours, theirs in NATIVE_LINEARS.items():
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
        for ours, theirs in GGUF_LAYER_NAMES.items():
            if p + theirs in rest and ours not in NATIVE_LINEARS:
                flat[f"layers.{i}.{ours}"] = rest[p + theirs]
        if p + "attn_q.bias" in rest:
            flat[f"layers.{i}.bqkv"] = torch.cat([rest[p + f"attn_{n}.bias"] for n in "qkv"])
    flat["embed"] = rest["token_embd.weight"]
    flat["final_norm"] = rest["output_norm.weight"]
    plain = cast_flat({k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}, dtype)
    return {**flat, **plain}


GGUF_LAYER_NAMES = {
    "attn_norm": "attn_norm.weight",
    "mlp_norm": "ffn_norm.weight",
    "wo": "attn_output.weight",
    "w_down": "ffn_down.weight",
    "q_norm": "attn_q_norm.weight",
    "k_norm": "attn_k_norm.weight",
    "post_attn_norm": "post_attention_norm.weight",
    "post_mlp_norm": "post_ffw_norm.weight",
}


def gguf_to_flat(tensors: dict[str, torch.Tensor], config: ModelConfig, dtype: torch.dtype) -> dict:
    """GGUF tensor names -> augury's flat names, fusing q/k/v and gate/up."""
    flat = {
        "embed": tensors["token_embd.weight"],
        "final_norm": tensors["output_norm.weight"],
    }
    if not config.tie_embeddings:
        flat["lm_head"] = tensors["output.weight"]
    for i in range(config.num_layers):
        p = f"blk.{i}."
        for ours, theirs in GGUF_LAYER_NAMES.items():
            if p + theirs in tensors:
                flat[f"layers.{i}.{ours}"] = tensors[p + theirs]
        flat[f"layers.{i}.wqkv"] = torch.cat([tensors[p + f"attn_{n}.weight"] for n in "qkv"])
        if p + "attn_q.bias" in tensors:
            flat[f"layers.{i}.bqkv"] = torch.cat([tensors[p + f"attn_{n}.bias"] for n in "qkv"])
        flat[f"layers.{i}.w_gate_up"] = torch.cat([tensors[p + "ffn_gate.weight"], tensors[p + "ffn_up.weight"]])
    return cast_flat(flat, dtype)


def cast_flat(flat: dict[str, torch.Tensor], dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Matrices and biases to the compute dtype; norm weights stay fp32 (norms run in fp32)."""
    return {
        name: tensor.to(torch.float32 if name.endswith("norm") else dtype).contiguous()
        for name, tensor in flat.items()
    }
