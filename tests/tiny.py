"""Tiny random models of each supported architecture (ARCHS; FAMILY_ARCHS in tests/test_families.py), built with transformers and saved as HF folders.

Tests compare augury's decoder against transformers on these, and the engine
tests use them as fast stand-ins for real models.
"""

from __future__ import annotations

from pathlib import Path

import torch

from augury.models.decoder import Decoder, ModelConfig, onednn_packing_available, pack_weights
from augury.models.loader import weights_from_flat

ARCHS = ("llama", "qwen2", "gemma3")


def hf_config(arch: str, vocab: int = 96, layers: int = 2):
    import transformers

    common = dict(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
    )
    if arch == "llama":
        return transformers.LlamaConfig(**common, rope_theta=10000.0)
    if arch == "qwen2":
        return transformers.Qwen2Config(**common, rope_theta=1000000.0)
    if arch == "qwen3":
        return transformers.Qwen3Config(**common, head_dim=16, rope_theta=1000000.0)
    if arch == "llama3":  # original context below the test's positions' reach: all three frequency bands differ
        scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=64, rope_theta=500000.0)
        return transformers.LlamaConfig(**common, head_dim=16, rope_parameters=scaling)
    if arch == "mistral":
        return transformers.MistralConfig(**common, head_dim=16, sliding_window=5)
    if arch == "phi3":
        return transformers.Phi3Config(**common, pad_token_id=0, bos_token_id=0, eos_token_id=1)
    if arch in ("phi3_longrope", "phi3_longrope_4k"):  # Phi-3 128k's scaling, pretrained on 32 positions: the
        # long model is "loaded" for 64 (long divisors, attention factor sqrt(1 + ln 2 / ln 32)), the other for
        # 32 (short divisors, factor 1); both sets far from 1 and from each other, so a wrong one shows
        scaling = dict(rope_type="longrope", rope_theta=10000.0, short_factor=[1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
                       long_factor=[1.0, 1.5, 2.5, 4.0, 7.0, 12.0, 20.0, 32.0])
        positions = 64 if arch == "phi3_longrope" else 32
        return transformers.Phi3Config(**{**common, "max_position_embeddings": positions}, rope_parameters=scaling,
                                       original_max_position_embeddings=32, pad_token_id=0, bos_token_id=0,
                                       eos_token_id=1)
    if arch == "gemma2":  # small caps, so that soft-capping changes the numbers
        return transformers.Gemma2Config(
            **{**common, "num_hidden_layers": max(layers, 2), "tie_word_embeddings": True},
            head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
            attn_logit_softcapping=1.5, final_logit_softcapping=4.0,
        )
    if arch == "gemma3":
        return transformers.Gemma3TextConfig(
            **{**common, "num_hidden_layers": max(layers, 3), "tie_word_embeddings": True},
            head_dim=32,
            sliding_window=4,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"][: max(layers, 3)],
            query_pre_attn_scalar=32,
        )
    raise ValueError(arch)


def hf_model(arch: str, seed: int = 0, **kw):
    """A transformers causal LM with random weights (fp32, eval mode)."""
    import transformers

    torch.manual_seed(seed)
    config = hf_config(arch, **kw)
    cls = transformers.Gemma3ForCausalLM if arch == "gemma3" else transformers.AutoModelForCausalLM
    model = cls.from_config(config) if cls is transformers.AutoModelForCausalLM else cls(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0.0 if arch.startswith("gemma") else 1.0, 0.2)  # gemma: x * (1 + w)
            else:
                param.normal_(0.0, 0.3 if "embed" in name else 0.15)
    return model.float().eval()


def save_hf(model, folder: Path) -> Path:
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def decoder_from_hf(folder: Path, dtype=torch.float32, exact: bool = True) -> Decoder:
    from augury.models import hf

    config = hf.read_config(folder)
    return Decoder(config, weights_from_flat(hf.read_weights(folder, config, dtype), config), exact=exact)


def random_decoder(
    vocab: int = 8,
    seed: int = 0,
    dtype=torch.float32,
    layers: int = 1,
    hidden: int = 32,
    arch: str = "llama",
    pack: bool = True,
) -> Decoder:
    """A very small random decoder without transformers, for engine tests (fast).

    pack: put bf16 matmul weights in oneDNN's packed layout where it runs, as the loader does.
    """
    config = ModelConfig(
        arch=arch,
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_layers=layers,
        num_heads=2,
        num_kv_heads=1,
        head_dim=hidden // 2,
        context_length=512,
    )
    gen = torch.Generator().manual_seed(seed)
    flat = {"embed": torch.randn(vocab, hidden, generator=gen), "final_norm": torch.ones(hidden),
            "lm_head": torch.randn(vocab, hidden, generator=gen) * 0.5}
    qkv_rows = (config.num_heads + 2 * config.num_kv_heads) * config.head_dim
    for i in range(layers):
        p = f"layers.{i}."
        flat[p + "attn_norm"] = torch.ones(hidden)
        flat[p + "mlp_norm"] = torch.ones(hidden)
        flat[p + "wqkv"] = torch.randn(qkv_rows, hidden, generator=gen) * 0.3
        flat[p + "wo"] = torch.randn(hidden, config.num_heads * config.head_dim, generator=gen) * 0.3
        flat[p + "w_gate_up"] = torch.randn(4 * hidden, hidden, generator=gen) * 0.3
        flat[p + "w_down"] = torch.randn(hidden, 2 * hidden, generator=gen) * 0.3
    flat = {k: v.to(torch.float32 if k.endswith("norm") else dtype) for k, v in flat.items()}
    weights = weights_from_flat(flat, config)
    if pack and onednn_packing_available(dtype, torch.device("cpu")):
        weights = pack_weights(weights)
    return Decoder(config, weights)


class CharTokenizer:
    """A stand-in tokenizer for tiny models: token i is one printable character.

    It has what the engine uses (decode, encode, eos_ids, vocab) and nothing else.
    """

    ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,;:!?-+*/=()[]{}<>@#$%^&_|~'\"`\n\t"

    def __init__(self, vocab_size: int, eos_id: int | None = None) -> None:
        assert vocab_size <= len(self.ALPHABET)
        self.vocab_size = vocab_size
        self.eos_ids = frozenset() if eos_id is None else frozenset({eos_id})
        self.bos_id = None
        self.vocab = {self.ALPHABET[i]: i for i in range(vocab_size)}

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        return [self.vocab[c] for c in text]

    def decode(self, ids: list[int], *, skip_special: bool = True) -> str:
        return "".join(self.ALPHABET[i] for i in ids if i not in self.eos_ids or not skip_special)

    def apply_chat_template(self, messages: list[dict], *, add_generation_prompt: bool = True) -> str:
        """A stand-in template over the tiny alphabet: each message as "<role initial> <content>."."""
        turns = "".join(f"{m['role'][0].upper()} {m['content']}." for m in messages)
        return turns + (" A " if add_generation_prompt else "")

    def encode_chat(self, messages: list[dict], *, add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt=add_generation_prompt))


def tiny_model(vocab: int = 8, seed: int = 0, dtype=torch.float32, eos_id: int | None = None, **kw):
    """A Model (decoder + CharTokenizer) small enough for thousands of engine runs."""
    from augury.models.loader import Model

    decoder = random_decoder(vocab=vocab, seed=seed, dtype=dtype, **kw)
    return Model(name=f"tiny-{seed}", decoder=decoder, tokenizer=CharTokenizer(vocab, eos_id), source=Path("."))


def greedy_equivalence(target, proposer, prompts, params, k: int, label: str) -> list:
    """Speculative greedy output equals plain greedy output on every prompt (the assertion); returns each
    prompt's speculative stats, for the caller's guard that something was drafted or accepted."""
    from augury.engine import Engine

    stats = []
    for prompt in prompts:
        plain = Engine(target).generate(prompt, params)
        spec = Engine(target, proposer, k=k).generate(prompt, params)
        assert spec.token_ids == plain.token_ids, f"{label}: speculative greedy output differs from plain"
        stats.append(spec.stats)
    return stats


def scheduler_events(scheduler, jobs: list[tuple[list[int], object]], timeout: float = 600.0, *,
                     start: bool = False) -> list:
    """Submit (prompt ids, SamplingParams) jobs all at once (then start the scheduler, if asked) and wait
    until each ends. Returns each job's last event (Finished or Failed) in order."""
    import threading

    from augury.scheduler import Failed, Finished

    ended: dict[int, object] = {}
    done = threading.Semaphore(0)

    def on_event(i: int):
        def handle(event) -> None:
            if isinstance(event, (Finished, Failed)):
                ended[i] = event
                done.release()
        return handle

    for i, (prompt, params) in enumerate(jobs):
        scheduler.submit(prompt, params, on_event(i))
    if start:
        scheduler.start()
    for _ in jobs:
        assert done.acquire(timeout=timeout), "the scheduler stopped answering"
    return [ended[i] for i in range(len(jobs))]


def run_scheduler(scheduler, jobs: list[tuple[list[int], object]], timeout: float = 600.0) -> list:
    """Submit (prompt ids, SamplingParams) jobs all at once, run the scheduler until each ends, stop it.

    Returns each job's GenerationResult in order; fails the test if any request failed.
    """
    from augury.scheduler import Failed

    try:
        ended = scheduler_events(scheduler, jobs, timeout, start=True)
    finally:
        scheduler.stop()
    failed = [e for e in ended if isinstance(e, Failed)]
    assert not failed, f"{len(failed)} requests failed, e.g. {failed[0]}"
    return [e.result for e in ended]


class DecoderHook:
    """Wraps a decoder so that a test acts ahead of every forward: `before(tokens)` runs first, whether
    the caller asks for logits (`forward`) or logits and states (`forward_states`, the step's call);
    `before_rows(blocks)` ahead of a ragged forward (`forward_rows`, the step's call on the native layer)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def before(self, tokens) -> None:
        """tokens: [B, T] the block about to run."""

    def forward(self, tokens, *args, **kwargs):
        self.before(tokens)
        return self.inner.forward(tokens, *args, **kwargs)

    def forward_states(self, tokens, *args, **kwargs):
        self.before(tokens)
        return self.inner.forward_states(tokens, *args, **kwargs)

    def before_rows(self, blocks: list[list[int]]) -> None:
        """blocks: each sequence's rows of a ragged forward (the native layer's step), about to run."""

    def forward_rows(self, blocks, *args, **kwargs):
        self.before_rows(blocks)
        return self.inner.forward_rows(blocks, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def stream_then_late(scheduler, stream: tuple[list[int], object], late: tuple[list[int], object],
                     before_late=None, wait_for: tuple[str, ...] = ("late",), timeout: float = 60.0) -> dict[str, list]:
    """Start a stream; once its first text arrives submit a late request (running before_late() first), and
    stop the scheduler once the requests named in wait_for ended. Returns every event of each, by name."""
    import threading

    from augury.scheduler import Failed, Finished, TextDelta

    started = threading.Event()
    events: dict[str, list] = {"stream": [], "late": []}

    def on(name):
        def handle(event) -> None:
            events[name].append(event)
            if isinstance(event, TextDelta):
                started.set()
        return handle

    scheduler.submit(*stream, on("stream"))
    scheduler.start()
    try:
        assert started.wait(timeout), "the stream never started"
        if before_late is not None:
            before_late()
        scheduler.submit(*late, on("late"))
        for _ in range(int(timeout * 100)):
            if all(any(isinstance(e, (Finished, Failed)) for e in events[name]) for name in wait_for):
                break
            threading.Event().wait(0.01)
    finally:
        scheduler.stop()
    return events
