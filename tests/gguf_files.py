"""Write a transformers model as a GGUF file the way llama.cpp's convert_hf_to_gguf.py lays it out.

One writer for every family the tests load (tests/test_loading.py, tests/test_families.py): the
tensor names come from the `gguf` package's own tables (gguf.constants TENSOR_NAMES), the per-family
changes are the converter's (llama's q/k row permutation, gemma's 1 + w norms, Phi-3's fused
tensors, the llama3 `rope_freqs` tensor, Phi-3's longrope tensors and keys, gemma2's soft-cap and
window keys). Beside it, `write_mixed_gguf`: a random model in the mixed block types of a Q4_K_M
file, for the kernel's own loading tests (tests/test_native_gguf.py).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from augury.kernels import reference

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


def cli_home(tmp_path: Path) -> Path:
    """A fresh AUGURY_HOME for a CLI subprocess that shares the real home's built kernels.

    The kernel is cached per home: a subprocess on an empty home would build
    it again (about 50 s on 2 cores), which is not what a CLI test is about.
    Without a kernel here the subprocess finds none either way.
    """
    from augury.kernels import extension

    home = tmp_path / "home"
    home.mkdir(parents=True, exist_ok=True)
    built = extension.extension()  # loaded in this process (from whichever home built it), or None
    if built is not None:
        (home / "kernels").symlink_to(Path(built.__file__).parent.parent, target_is_directory=True)
    return home


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


# -- a random model quantized in mixed block types, as a Q4_K_M file mixes them (tests/test_native_gguf.py) --

MIXED_VOCAB = 93  # not a multiple of the kernel's 16-column tiles: the head has a tail
MIXED_HIDDEN, MIXED_INTER, MIXED_HEADS, MIXED_KV_HEADS, MIXED_LAYERS = 256, 512, 4, 2, 2
MIXED_HEAD_DIM = MIXED_HIDDEN // MIXED_HEADS

# Block type per tensor, as a Q4_K_M file mixes them (v and some down projections in Q6_K).
MIXED_TYPES = {
    "token_embd.weight": "Q4_K",
    "output.weight": "Q6_K",
    "attn_q.weight": "Q4_K",
    "attn_k.weight": "Q4_K",
    "attn_v.weight": "Q6_K",
    "attn_output.weight": "Q4_K",
    "ffn_gate.weight": "Q4_K",
    "ffn_up.weight": "Q5_K",
    "blk.0.ffn_down.weight": "Q6_K",
    "blk.1.ffn_down.weight": "Q8_0",
}


def _type_of(name: str, odd: dict[str, str]) -> str | None:
    if name in odd:
        return odd[name]
    if name in MIXED_TYPES:
        return MIXED_TYPES[name]
    return MIXED_TYPES.get(name.split(".", 2)[-1])


def _q2_k_blocks(rows: int, n_in: int, gen: torch.Generator) -> np.ndarray:
    """Random Q2_K blocks (a format the kernel does not cover) with finite fp16 scales."""
    n = rows * n_in // 256
    blocks = torch.randint(0, 256, (n, 84), dtype=torch.uint8, generator=gen)
    for pos in (80, 82):
        blocks[:, pos : pos + 2] = (torch.rand(n, generator=gen) * 0.002 + 0.0005).half().view(torch.uint8).view(n, 2)
    return blocks.reshape(rows, -1).numpy()


def write_mixed_gguf(path: Path, arch: str = "qwen2", *, tied: bool = False, odd: dict[str, str] | None = None) -> Path:
    """A tiny random model as a GGUF file with mixed block types (see MIXED_TYPES; `odd` overrides some)."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    odd = odd or {}
    gen = torch.Generator().manual_seed(11)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(MIXED_LAYERS)
    writer.add_context_length(256)
    writer.add_embedding_length(MIXED_HIDDEN)
    writer.add_feed_forward_length(MIXED_INTER)
    writer.add_head_count(MIXED_HEADS)
    writer.add_head_count_kv(MIXED_KV_HEADS)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(10000.0)
    chars = list(bytes_to_unicode().values())[: MIXED_VOCAB - 2]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(["<s>", "</s>", *chars])
    writer.add_token_types([3, 3] + [1] * len(chars))
    writer.add_token_merges([])
    writer.add_token_scores([0.0] * MIXED_VOCAB)
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(1)

    def add(name: str, rows: int, cols: int, std: float) -> None:
        kind = _type_of(name, odd)
        if kind == "Q2_K":
            writer.add_tensor(name, _q2_k_blocks(rows, cols, gen), raw_dtype=gguf.GGMLQuantizationType.Q2_K)
            return
        w = torch.randn(rows, cols, generator=gen) * std
        raw = reference.quantize(kind, w)
        writer.add_tensor(name, raw.numpy(), raw_dtype=gguf.GGMLQuantizationType[kind])

    def add_plain(name: str, values: torch.Tensor) -> None:
        writer.add_tensor(name, values.float().numpy())

    add("token_embd.weight", MIXED_VOCAB, MIXED_HIDDEN, 1.0)
    add_plain("output_norm.weight", 1 + 0.1 * torch.randn(MIXED_HIDDEN, generator=gen))
    if not tied:
        add("output.weight", MIXED_VOCAB, MIXED_HIDDEN, 0.1)
    kv = MIXED_KV_HEADS * MIXED_HEAD_DIM
    for i in range(MIXED_LAYERS):
        p = f"blk.{i}."
        add_plain(p + "attn_norm.weight", 1 + 0.1 * torch.randn(MIXED_HIDDEN, generator=gen))
        add_plain(p + "ffn_norm.weight", 1 + 0.1 * torch.randn(MIXED_HIDDEN, generator=gen))
        add(p + "attn_q.weight", MIXED_HIDDEN, MIXED_HIDDEN, 0.08)
        add(p + "attn_k.weight", kv, MIXED_HIDDEN, 0.08)
        add(p + "attn_v.weight", kv, MIXED_HIDDEN, 0.08)
        add(p + "attn_output.weight", MIXED_HIDDEN, MIXED_HIDDEN, 0.06)
        add(p + "ffn_gate.weight", MIXED_INTER, MIXED_HIDDEN, 0.06)
        add(p + "ffn_up.weight", MIXED_INTER, MIXED_HIDDEN, 0.06)
        add(p + "ffn_down.weight", MIXED_HIDDEN, MIXED_INTER, 0.05)
        if arch == "qwen2":
            for n, size in (("q", MIXED_HIDDEN), ("k", kv), ("v", kv)):
                add_plain(p + f"attn_{n}.bias", 0.1 * torch.randn(size, generator=gen))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
