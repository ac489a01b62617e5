"""Other engines on the same weights and prompts, interleaved with augury's methods in one run.

* `hf`: transformers autoregressive `generate` (greedy or sampled);
* `hf-assisted`: transformers assisted generation with the same draft model;
* `hf-lookup`: transformers prompt lookup (`prompt_lookup_num_tokens`);
* `llamacpp`: llama.cpp's own binaries on the target's GGUF (`--llama-cpp DIR`):
  `llama-completion` for plain decoding and `llamacpp-spec`,
  `llama-speculative-simple --spec-type draft-simple` with the draft model's
  GGUF; `llamacpp-lookup` (its ngram-simple drafter) on request.

The transformers models are built directly from augury's already loaded
tensors (the converted-weights cache), not by transformers' own GGUF loader:
the tensors are the same bits augury runs on, the fused q/k/v and gate/up
matrices are handed over as views (no copy), and it takes a second instead of
~100 s of dequantization. The speculative peers draft K tokens per step like
augury (`num_assistant_tokens=K` with a constant schedule and no confidence
cut-off; `prompt_lookup_num_tokens=K`; llama.cpp's `--spec-draft-n-max K`,
with its own default confidence cut-off), so the comparison is at equal K.

Decode time is wall time minus prefill, as for augury. transformers fuses
the prompt's prefill with the first speculative step (assisted generation
verifies its first draft in the same forward as the prompt), so its prefill
cannot be read off the stream; each transformers peer instead times a plain
forward of the prompt (and the assistant's, for hf-assisted) just before
`generate` and subtracts that. llama.cpp runs in its own process, one per
generation, and its own timings are used: prompt eval (or "encoded") is the
prefill, eval and sampling (or "decoded") the decode. End-to-end ratios,
which need no such split, are reported next to the decode ones.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from augury.bench.llama_cpp import LLAMA_CPP_TOOLS, LlamaCppContender, llama_cpp_binary
from augury.bench.records import Messages, Outcome
from augury.errors import AuguryError
from augury.metrics import SpecStats
from augury.models.decoder import ModelConfig, dense_weight
from augury.models.loader import Model
from augury.sampling import SamplingParams

# Peer name -> the augury method doing the same job, for the ratio in the summary (llama.cpp's peers
# carry theirs in LLAMA_CPP_TOOLS).
COUNTERPARTS = {
    "hf": "plain",
    "hf-assisted": "model",
    "hf-lookup": "ngram",
}
# What --peers accepts; "llamacpp" runs llama.cpp plain and with the draft model.
PEER_GROUPS = {
    "hf": ("hf",),
    "hf-assisted": ("hf-assisted",),
    "hf-lookup": ("hf-lookup",),
    "llamacpp": ("llamacpp", "llamacpp-spec"),
    "llamacpp-plain": ("llamacpp",),
    "llamacpp-spec": ("llamacpp-spec",),
    "llamacpp-lookup": ("llamacpp-lookup",),
}
PEERS_WITH_DRAFT = ("hf-assisted", "llamacpp-spec")  # peers that run the draft model too


def parse_peers(spec: str | None) -> list[str]:
    """Peer names from a comma list, groups expanded, order kept, duplicates dropped."""
    if not spec:
        return []
    names: list[str] = []
    for item in (s.strip() for s in spec.split(",") if s.strip()):
        if item not in PEER_GROUPS:
            raise AuguryError(f"unknown peer '{item}' (choose from {', '.join(PEER_GROUPS)})")
        names.extend(n for n in PEER_GROUPS[item] if n not in names)
    return names


# -- transformers models from augury's tensors -------------------------------------------


def _hf_config(config: ModelConfig, dtype: torch.dtype):
    """The transformers config describing the same network as augury's ModelConfig."""
    import transformers

    common = dict(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        rms_norm_eps=config.rms_eps,
        max_position_embeddings=config.context_length,
        tie_word_embeddings=config.tie_embeddings,
        dtype=dtype,
    )
    rope = {"rope_type": "default", "rope_theta": config.rope_theta}
    if config.arch == "llama":
        return transformers.LlamaConfig(**common, rope_parameters=rope, attention_bias=config.qkv_bias)
    if config.arch == "qwen2":
        return transformers.Qwen2Config(**common, rope_parameters=rope)
    if config.arch == "gemma3":
        return transformers.Gemma3TextConfig(
            **common,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=round(config.query_scale**-2) if config.query_scale else config.head_dim,
            sliding_window=config.sliding_window,
            layer_types=[
                "sliding_attention" if config.is_sliding(i) else "full_attention" for i in range(config.num_layers)
            ],
            rope_parameters={
                "full_attention": rope,
                "sliding_attention": {
                    "rope_type": "default",
                    "rope_theta": config.rope_theta_local or config.rope_theta,
                },
            },
            final_logit_softcapping=None,
            attn_logit_softcapping=None,
        )
    raise AuguryError(f"no transformers peer for architecture '{config.arch}'")


def _hf_state_dict(model: Model, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """augury's tensors under transformers' names; fused matrices split as views."""
    config, w = model.config, model.decoder.weights
    plain = dense_weight  # packed weights are rebuilt as plain tensors (a copy); plain ones are shared
    # gemma stores norm weights as w in x * (1 + w); augury keeps the full multiplier.
    shift = 1.0 if config.arch == "gemma3" else 0.0

    def norm(t: torch.Tensor) -> torch.Tensor:
        return (t.float() - shift).to(dtype)

    q_rows, kv_rows = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    sd = {"model.embed_tokens.weight": w.embed, "model.norm.weight": norm(w.final_norm)}
    if not config.tie_embeddings:
        sd["lm_head.weight"] = plain(w.lm_head)
    for i, layer in enumerate(w.layers):
        p = f"model.layers.{i}."
        for name, part in zip("qkv", plain(layer.wqkv).split([q_rows, kv_rows, kv_rows])):
            sd[p + f"self_attn.{name}_proj.weight"] = part
        if layer.bqkv is not None:
            for name, part in zip("qkv", layer.bqkv.split([q_rows, kv_rows, kv_rows])):
                sd[p + f"self_attn.{name}_proj.bias"] = part
        sd[p + "self_attn.o_proj.weight"] = plain(layer.wo)
        gate, up = plain(layer.w_gate_up).split([config.intermediate_size, config.intermediate_size])
        sd.update({p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up})
        sd[p + "mlp.down_proj.weight"] = plain(layer.w_down)
        sd[p + "input_layernorm.weight"] = norm(layer.attn_norm)
        if config.post_norms:
            sd[p + "post_attention_layernorm.weight"] = norm(layer.post_attn_norm)
            sd[p + "pre_feedforward_layernorm.weight"] = norm(layer.mlp_norm)
            sd[p + "post_feedforward_layernorm.weight"] = norm(layer.post_mlp_norm)
        else:
            sd[p + "post_attention_layernorm.weight"] = norm(layer.mlp_norm)
        if config.qk_norm:
            sd[p + "self_attn.q_norm.weight"] = norm(layer.q_norm)
            sd[p + "self_attn.k_norm.weight"] = norm(layer.k_norm)
    return sd


def hf_model_from(model: Model):
    """A transformers causal LM running on the very tensors of an augury Model."""
    import transformers
    from transformers.initialization import no_init_weights

    dtype = model.decoder.dtype
    config = _hf_config(model.config, dtype)
    with no_init_weights():
        hf = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    missing, unexpected = hf.load_state_dict(_hf_state_dict(model, dtype), strict=False, assign=True)
    missing = [m for m in missing if not (model.config.tie_embeddings and m == "lm_head.weight")]
    if missing or unexpected:
        raise AuguryError(f"cannot build a transformers peer: missing {missing[:3]}, unexpected {unexpected[:3]}")
    if model.config.tie_embeddings:
        hf.lm_head.weight = hf.model.embed_tokens.weight
    return hf.to(dtype=dtype).eval()


def _cut_at_eos(tokens: list[int], eos_ids: frozenset[int], max_tokens: int) -> tuple[list[int], str]:
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[:i], "stop"
    return tokens[:max_tokens], "length" if len(tokens) >= max_tokens else "stop"


class HFContender:
    """transformers generate: autoregressive, assisted by a draft model, or prompt lookup."""

    kind = "peer"
    lossless = False  # other kernels: greedy bf16 outputs may leave augury's at near-ties

    def __init__(self, method: str, target: Model, hf_target, k: int, hf_draft=None, lookup: bool = False) -> None:
        self.method = method
        self.k = k if (hf_draft is not None or lookup) else 0
        self.counterpart = COUNTERPARTS.get(method)
        self.tokenizer = target.tokenizer
        self.model = hf_target
        self.draft = hf_draft
        self.lookup = lookup
        self.eos_ids = target.tokenizer.eos_ids

    def _generation_config(self, params: SamplingParams):
        import transformers

        eos = sorted(self.eos_ids)
        kw: dict = dict(
            max_new_tokens=params.max_tokens,
            eos_token_id=(eos or None) if not params.ignore_eos else None,
            pad_token_id=eos[0] if eos else 0,
            do_sample=not params.greedy,
        )
        if not params.greedy:
            kw.update(temperature=params.temperature, top_k=params.top_k or None, top_p=params.top_p,
                      min_p=params.min_p or None, repetition_penalty=params.repetition_penalty)
        if self.draft is not None:
            kw.update(num_assistant_tokens=self.k, num_assistant_tokens_schedule="constant",
                      assistant_confidence_threshold=0.0)
        if self.lookup:
            kw.update(prompt_lookup_num_tokens=self.k)
        return transformers.GenerationConfig(**kw)

    def _prefill_s(self, ids: torch.Tensor) -> float:
        """Seconds a plain forward of the prompt takes (target, plus the assistant's when assisted)."""
        t0 = time.perf_counter()
        self.model(ids, use_cache=True)
        if self.draft is not None:
            self.draft(ids, use_cache=True)
        return time.perf_counter() - t0

    def generate(self, messages: Messages, prompt_ids: list[int] | None, params: SamplingParams) -> Outcome:
        assert prompt_ids is not None
        if params.seed is not None:
            torch.manual_seed(params.seed)
        ids = torch.tensor([prompt_ids], device=self.model.device)
        extra = {"assistant_model": self.draft} if self.draft is not None else {}
        with torch.inference_mode():
            prefill = self._prefill_s(ids)
            t0 = time.perf_counter()
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), generation_config=self._generation_config(params), **extra
            )
            total = time.perf_counter() - t0
        tokens, reason = _cut_at_eos(out[0, len(prompt_ids):].tolist(), self.eos_ids, params.max_tokens)
        stats = SpecStats(
            prompt_tokens=len(prompt_ids), generated_tokens=len(tokens), prefill_s=min(prefill, total), total_s=total
        )
        return Outcome(tokens, self.tokenizer.decode(tokens), stats, reason)


def build_peers(
    names: list[str],
    target: Model,
    draft: Model | None,
    k: int,
    n_ctx: int,
    notes: list[str],
    *,
    llama_cpp: str | os.PathLike | None = None,
    draft_file: Path | None = None,
    chat: bool = True,
) -> list:
    """Contenders for the requested peers (llama.cpp's run the binaries in the llama_cpp folder)."""
    peers: list = []
    hf_names = [n for n in names if n.startswith("hf")]
    if hf_names:
        hf_target = hf_model_from(target)
        hf_draft = None
        if "hf-assisted" in hf_names:
            if draft is None:
                raise AuguryError("the hf-assisted peer needs a draft model (--draft)")
            hf_draft = hf_model_from(draft)
        for name in hf_names:
            peers.append(
                HFContender(name, target, hf_target, k, hf_draft=hf_draft if name == "hf-assisted" else None,
                            lookup=name == "hf-lookup")
            )
        notes.append("transformers peers run on augury's own loaded tensors (same bits), greedy or sampled "
                     "like augury, speculative ones at the same K")
    cpp_names = [n for n in names if n in LLAMA_CPP_TOOLS]
    threads = torch.get_num_threads()
    for name in cpp_names:
        binary = llama_cpp_binary(llama_cpp, LLAMA_CPP_TOOLS[name].binary)
        peers.append(LlamaCppContender(name, target, binary, chat=chat, n_ctx=n_ctx, threads=threads, k=k,
                                       draft=draft_file))
    if cpp_names:
        notes.append(f"llama.cpp peers run {llama_cpp} on {target.source.name} with {threads} threads, "
                     "timed by llama.cpp itself (prefill: prompt eval; decode: eval and sampling)")
    return peers
