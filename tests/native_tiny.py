"""Tiny decoders with GGUF-block weights built in memory, in the shapes of three architectures, for the
native layer's tests (tests/test_native_layer.py) and for the engine's tests that need the native
layer's ragged rows (tests/test_chunked_prefill.py).

qwen2: q/k/v biases and GQA; llama: GQA, no biases; gemma3: q/k norms, norms after attention and
MLP, GELU, sliding-window layers with their own RoPE base, a scaled embedding, a tied head.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from augury.kernels import reference
from augury.kernels.weight import GgufWeight
from augury.models.decoder import Decoder, LayerWeights, ModelConfig, Weights

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM, LAYERS, VOCAB = 256, 512, 4, 2, 64, 2, 77
ARCHS = ("qwen2", "llama", "gemma3")


def native_config(arch: str) -> ModelConfig:
    switches = {}
    if arch == "qwen2":
        switches = {"qkv_bias": True}
    if arch == "gemma3":
        switches = {
            "qk_norm": True, "post_norms": True, "embed_scale": math.sqrt(HIDDEN), "activation": "gelu_tanh",
            "tie_embeddings": True, "sliding_window": 9, "sliding_pattern": 2, "rope_theta_local": 1000.0,
            "query_scale": 0.1,
        }
    return ModelConfig(
        arch=arch, vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=INTER, num_layers=LAYERS,
        num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, context_length=512, **switches,
    )


def quant_blocks(kind: str, rows: int, cols: int, std: float, gen: torch.Generator) -> tuple[str, torch.Tensor]:
    return kind, reference.quantize(kind, torch.randn(rows, cols, generator=gen) * std)


def native_weights(arch: str, dtype: torch.dtype, seed: int = 0) -> Weights:
    """Random GGUF-block weights for `native_config(arch)`: mixed block types as a Q4_K_M file has them."""
    c = native_config(arch)
    gen = torch.Generator().manual_seed(seed)
    kv = KV_HEADS * HEAD_DIM

    def norm(n: int) -> torch.Tensor:
        return (1 + 0.1 * torch.randn(n, generator=gen)).float()

    layers = []
    for i in range(LAYERS):
        qkv = [quant_blocks("Q4_K", HIDDEN, HIDDEN, 0.08, gen), quant_blocks("Q4_K", kv, HIDDEN, 0.08, gen),
               quant_blocks("Q6_K", kv, HIDDEN, 0.08, gen)]
        down_kind = "Q6_K" if i == 0 else "Q8_0"
        layers.append(LayerWeights(
            attn_norm=norm(HIDDEN), mlp_norm=norm(HIDDEN),
            wqkv=GgufWeight(qkv, dtype=dtype),
            wo=GgufWeight([quant_blocks("Q4_K", HIDDEN, HIDDEN, 0.06, gen)], dtype=dtype),
            w_gate_up=GgufWeight([quant_blocks("Q4_K", INTER, HIDDEN, 0.06, gen),
                                  quant_blocks("Q5_K", INTER, HIDDEN, 0.06, gen)], dtype=dtype),
            w_down=GgufWeight([quant_blocks(down_kind, HIDDEN, INTER, 0.05, gen)], dtype=dtype),
            bqkv=(0.1 * torch.randn(HIDDEN + 2 * kv, generator=gen)).to(dtype) if c.qkv_bias else None,
            q_norm=norm(HEAD_DIM) if c.qk_norm else None,
            k_norm=norm(HEAD_DIM) if c.qk_norm else None,
            post_attn_norm=norm(HIDDEN) if c.post_norms else None,
            post_mlp_norm=norm(HIDDEN) if c.post_norms else None,
        ))
    embed_std = 1.0 / math.sqrt(HIDDEN) if c.embed_scale != 1 else 1.0
    embed_blocks = GgufWeight([quant_blocks("Q8_0", VOCAB, HIDDEN, embed_std, gen)], dtype=dtype)
    embed = embed_blocks.dense().to(dtype)
    head = (embed_blocks if c.tie_embeddings
            else GgufWeight([quant_blocks("Q6_K", VOCAB, HIDDEN, 0.1, gen)], dtype=dtype))
    return Weights(embed=embed, final_norm=norm(HIDDEN), lm_head=head, layers=layers)



def native_model(arch: str = "qwen2", seed: int = 0):
    """A Model (a native-layer decoder + CharTokenizer over VOCAB ids) for engine and scheduler tests."""
    from augury.models.loader import Model
    from tests.tiny import CharTokenizer

    decoder = Decoder(native_config(arch), native_weights(arch, torch.float32, seed))
    assert decoder.native is not None, "the native layer did not build for the tiny model"
    return Model(name=f"native-{arch}-{seed}", decoder=decoder, tokenizer=CharTokenizer(VOCAB), source=Path("."))
