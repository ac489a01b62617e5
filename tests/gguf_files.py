"""Write a transformers model as a GGUF file the way llama.cpp's convert_hf_to_gguf.py lays it out.

One writer for every family the tests load (tests/test_loading.py, tests/test_families.py): the
tensor names come from the `gguf` package's own tables (gguf.constants TENSOR_NAMES), the per-family
changes are the converter's (llama's q/k row permutation, gemma's 1 + w norms, Phi-3's fused
tensors, the llama3 `rope_freqs` tensor, Phi-3's longrope tensors and keys, gemma2's soft-cap and
window keys).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np

VOCAB = 96


def token_list(vocab: int = VOCAB) -> list[str]:
    """A byte-level BPE vocabulary with no merges: "<s>", "</s>", then single characters."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return ["<s>", "</s>", *list(bytes_to_unicode().values())[: vocab - 2]]


def permute_for_gguf(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order for llama (interleaved rotary), as its converter writes it. w: [heads * D, ...]."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# transformers' names (after "model.layers.N.") -> the gguf package's tensor kinds.
LAYER_TENSORS = {
    "input_layernorm.weight": "ATTN_NORM",
    "post_attention_layernorm.weight": "ATTN_POST_NORM",  # gemma's; the others' is the pre-MLP norm (below)
    "pre_feedforward_layernorm.weight": "FFN_NORM",
    "post_feedforward_layernorm.weight": "FFN_POST_NORM",
    "self_attn.q_proj.weight": "ATTN_Q",
    "self_attn.k_proj.weight": "ATTN_K",
    "self_attn.v_proj.weight": "ATTN_V",
    "self_attn.qkv_proj.weight": "ATTN_QKV",
    "self_attn.q_proj.bias": "ATTN_Q",
    "self_attn.k_proj.bias": "ATTN_K",
    "self_attn.v_proj.bias": "ATTN_V",
    "self_attn.o_proj.weight": "ATTN_OUT",
    "self_attn.q_norm.weight": "ATTN_Q_NORM",
    "self_attn.k_norm.weight": "ATTN_K_NORM",
    "mlp.gate_proj.weight": "FFN_GATE",
    "mlp.up_proj.weight": "FFN_UP",
    "mlp.gate_up_proj.weight": "FFN_UP",  # Phi-3: gate and up in one tensor, gate first
    "mlp.down_proj.weight": "FFN_DOWN",
}

GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
             "gemma2": "gemma2", "gemma3_text": "gemma3"}


def write_hf_as_gguf(
    path: Path,
    model,
    *,
    arch: str | None = None,
    quant=None,
    odd_tensor_type=None,
    drop: tuple[str, ...] = (),
    chat_template: str | None = None,
    tokens: list[str] | None = None,
) -> Path:
    """Write a transformers causal LM (fp32) as a GGUF file.

    arch: the general.architecture to write (default: the model's own; another name writes a file of an
    architecture augury does not know). quant: a GGMLQuantizationType for every 2-D tensor. drop: tensor
    names left out (a broken file). tokens: the vocabulary (default `token_list()`).
    """
    import gguf
    from gguf.constants import MODEL_TENSOR, TENSOR_NAMES

    cfg = model.config
    model_type = cfg.model_type
    name = GGUF_ARCH[model_type]
    writer = gguf.GGUFWriter(str(path), arch or name)
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    rope = cfg.rope_parameters or {}
    writer.add_block_count(cfg.num_hidden_layers)
    writer.add_context_length(cfg.max_position_embeddings)
    writer.add_embedding_length(cfg.hidden_size)
    writer.add_feed_forward_length(cfg.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    writer.add_rope_freq_base(float(rope.get("rope_theta", 10000.0)))
    if model_type == "phi3":
        writer.add_rope_dimension_count(head_dim)
    if model_type in ("mistral", "phi3") and getattr(cfg, "sliding_window", None):
        # augury reads the window where a file has one; llama.cpp's converter writes none for Mistral
        # (whose real GGUFs then load without it, as llama.cpp runs them)
        writer.add_sliding_window(cfg.sliding_window)
    if model_type == "gemma2":
        writer.add_sliding_window(cfg.sliding_window)
        writer.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        writer.add_final_logit_softcapping(cfg.final_logit_softcapping)
    tokens = tokens or token_list()
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([3, 3] + [1] * (len(tokens) - 2))
    writer.add_token_merges([])
    writer.add_token_scores([0.0] * len(tokens))
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)
    if chat_template is not None:
        writer.add_chat_template(chat_template)

    def add(tensor_name: str, array: np.ndarray) -> None:
        if tensor_name in drop:
            return
        if quant is not None and array.ndim == 2:
            writer.add_tensor(tensor_name, gguf.quants.quantize(array, quant), raw_dtype=quant)
        else:
            writer.add_tensor(tensor_name, np.ascontiguousarray(array, dtype=np.float32))

    gemma = model_type.startswith("gemma")
    sd = {k.removeprefix("model."): v.detach().float().numpy() for k, v in model.state_dict().items()}
    add(TENSOR_NAMES[MODEL_TENSOR.TOKEN_EMBD] + ".weight", sd["embed_tokens.weight"])
    add(TENSOR_NAMES[MODEL_TENSOR.OUTPUT_NORM] + ".weight", sd["norm.weight"] + gemma)
    if not cfg.tie_word_embeddings:
        add(TENSOR_NAMES[MODEL_TENSOR.OUTPUT] + ".weight", sd["lm_head.weight"])
    if rope.get("rope_type") == "llama3":  # the converter stores llama3 scaling as one divisor per frequency
        from augury.models.families import llama3_factors

        factors = llama3_factors(head_dim, float(rope["rope_theta"]), rope)
        add(TENSOR_NAMES[MODEL_TENSOR.ROPE_FREQS] + ".weight", np.array(factors, dtype=np.float32))
    if rope.get("rope_type") == "longrope":  # Phi-3 128k: both divisor sets, the pretraining length, the factor
        original = rope["original_max_position_embeddings"]
        scale = cfg.max_position_embeddings / original
        writer.add_rope_scaling_orig_ctx_len(original)
        writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
        for kind in ("long", "short"):
            add(TENSOR_NAMES[MODEL_TENSOR[f"ROPE_FACTORS_{kind.upper()}"]] + ".weight",
                np.array(rope[f"{kind}_factor"], dtype=np.float32))
    for i in range(cfg.num_hidden_layers):
        for theirs, kind in LAYER_TENSORS.items():
            array = sd.get(f"layers.{i}.{theirs}")
            if array is None:
                continue
            if theirs == "post_attention_layernorm.weight" and not gemma:
                kind = "FFN_NORM"
            if theirs.endswith("norm.weight") and gemma:
                array = array + 1  # gemma's x * (1 + w), stored as the full multiplier
            if kind in ("ATTN_Q", "ATTN_K") and GGUF_ARCH[model_type] == "llama":
                array = permute_for_gguf(array, heads if kind == "ATTN_Q" else kv_heads)
            suffix = theirs.rsplit(".", 1)[1]
            add(TENSOR_NAMES[MODEL_TENSOR[kind]].format(bid=i) + "." + suffix, array)
    if odd_tensor_type is not None:
        writer.add_tensor("blk.0.extra.weight", np.zeros((1, 66), dtype=np.uint8), raw_dtype=odd_tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def private_home(tmp_path_factory) -> Iterator[None]:
    """For a module fixture: the kernel built (or found) under the real AUGURY_HOME first, then a private
    AUGURY_HOME for the files converted from the tiny models, restored afterwards."""
    from augury.kernels import extension

    extension.extension()
    before = os.environ.get("AUGURY_HOME")
    os.environ["AUGURY_HOME"] = str(tmp_path_factory.mktemp("home"))
    yield
    if before is None:
        del os.environ["AUGURY_HOME"]
    else:
        os.environ["AUGURY_HOME"] = before
