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

import json
import os
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from augury.bench.records import Messages, Outcome
from augury.errors import AuguryError
from augury.metrics import SpecStats
from augury.models.decoder import ModelConfig, dense_weight
from augury.models.loader import Model
from augury.sampling import SamplingParams

# Peer name -> the augury method doing the same job, for the ratio in the summary.
COUNTERPARTS = {
    "hf": "plain",
    "hf-assisted": "model",
    "hf-lookup": "ngram",
    "llamacpp": "plain",
    "llamacpp-spec": "model",
    "llamacpp-lookup": "ngram",
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


# -- llama.cpp's own binaries ------------------------------------------------------------


@dataclass(frozen=True)
class LlamaCppTool:
    """One way of running llama.cpp: a binary and, for speculation, its drafter type and draft-length flag."""

    binary: str
    spec_type: str | None = None  # None: plain decoding
    k_flag: str | None = None  # the flag that sets the draft length K
    draft_model: bool = False  # runs the draft model's GGUF (-md)


LLAMA_CPP_TOOLS = {
    "llamacpp": LlamaCppTool("llama-completion"),
    "llamacpp-spec": LlamaCppTool("llama-speculative-simple", "draft-simple", "--spec-draft-n-max", draft_model=True),
    "llamacpp-lookup": LlamaCppTool("llama-speculative-simple", "ngram-simple", "--spec-ngram-simple-size-m"),
}
PEERS_WITH_DRAFT = ("hf-assisted", "llamacpp-spec")  # peers that run the draft model too
LLAMA_CPP_TIMEOUT_S = 1800.0
_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"


def llama_cpp_binary(folder: str | os.PathLike | None, name: str) -> Path:
    """The path of one llama.cpp binary in the --llama-cpp folder, or one clear error."""
    if folder is None:
        raise AuguryError(
            "the llamacpp peers need --llama-cpp DIR, the folder holding llama.cpp's binaries "
            "(../shared/peers/build-llama-cpp.sh builds them)"
        )
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise AuguryError(f"--llama-cpp {folder}: no such folder")
    path = root / name
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise AuguryError(f"--llama-cpp {folder} holds no executable {name}")
    return path


def check_llama_cpp(names: list[str], folder: str | os.PathLike | None) -> None:
    """Fail before anything loads if a requested llama.cpp peer's binary is missing."""
    for name in names:
        if name in LLAMA_CPP_TOOLS:
            llama_cpp_binary(folder, LLAMA_CPP_TOOLS[name].binary)


def gguf_file(path: Path | None, role: str) -> Path:
    """llama.cpp reads GGUF files only; say so in one line for anything else."""
    if path is None or path.suffix != ".gguf" or not path.is_file():
        raise AuguryError(f"the llamacpp peers need a GGUF {role}; {path} is not one")
    return path


def run_llama_cpp(command: list[str], timeout_s: float = LLAMA_CPP_TIMEOUT_S) -> tuple[str, str]:
    """Run one llama.cpp binary to the end; its stdout and stderr, or one line naming what went wrong."""
    name = Path(command[0]).name
    try:
        done = subprocess.run(command, capture_output=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise AuguryError(f"{name} did not finish within {timeout_s:.0f} s") from None
    except OSError as exc:
        raise AuguryError(f"cannot run {command[0]}: {exc.strerror or exc}") from None
    out = done.stdout.decode("utf-8", errors="replace")
    err = done.stderr.decode("utf-8", errors="replace")
    if done.returncode != 0:
        last = next((line.strip() for line in reversed(err.splitlines()) if line.strip()), "no message")
        raise AuguryError(f"{name} failed (exit {done.returncode}): {last}")
    return out, err


def _last(pattern: str, text: str, tool: str, what: str) -> tuple[str, ...]:
    """The groups of the last match (a binary may print a figure more than once); a clear error if none."""
    found = re.findall(pattern, text)
    if not found:
        raise AuguryError(f"{tool} printed no '{what}' line; is this llama.cpp's {tool}?")
    last = found[-1]
    return last if isinstance(last, tuple) else (last,)


@dataclass(frozen=True)
class LlamaCppTimings:
    """What one llama.cpp run reported about itself, in augury's terms."""

    prompt_tokens: int
    prefill_s: float
    decode_s: float
    drafted: int = 0
    accepted: int = 0
    committed: int = 0  # tokens the speculative loop committed (its n_predict); 0 for plain decoding


def parse_completion_timings(stderr: str) -> LlamaCppTimings:
    """llama-completion's perf lines: prompt eval is the prefill, eval plus sampling the decode.

    "eval time = Y ms / M runs" covers the forwards after the first token, which
    the prompt's forward yields, the same split as augury's prefill_s. Sampling is
    added to the decode because augury's decode wall time includes its own.
    """
    tool = "llama-completion"
    prefill_ms, prompt_tokens = _last(rf"prompt eval time\s*=\s*{_NUMBER} ms\s*/\s*(\d+) tokens", stderr, tool,
                                      "prompt eval time")
    (eval_ms, _runs) = _last(rf"(?<!prompt )eval time\s*=\s*{_NUMBER} ms\s*/\s*(\d+) runs", stderr, tool, "eval time")
    sampling = re.findall(rf"sampling time\s*=\s*{_NUMBER} ms", stderr)
    sampling_ms = float(sampling[-1]) if sampling else 0.0
    return LlamaCppTimings(int(prompt_tokens), float(prefill_ms) / 1e3, (float(eval_ms) + sampling_ms) / 1e3)


def parse_speculative_timings(stderr: str) -> LlamaCppTimings:
    """llama-speculative-simple's summary: encoded (prefill), decoded (the loop), n_drafted, n_accept."""
    tool = "llama-speculative-simple"
    prompt_tokens, enc_s = _last(rf"encoded\s+(\d+) tokens in\s+{_NUMBER} seconds", stderr, tool, "encoded")
    committed, dec_s = _last(rf"decoded\s+(\d+) tokens in\s+{_NUMBER} seconds", stderr, tool, "decoded")
    (drafted,) = _last(r"n_drafted\s*=\s*(\d+)", stderr, tool, "n_drafted")
    (accepted,) = _last(r"n_accept\s*=\s*(\d+)", stderr, tool, "n_accept")
    return LlamaCppTimings(
        int(prompt_tokens), float(enc_s), float(dec_s), int(drafted), int(accepted), committed=int(committed)
    )


def _sampling_flags(params: SamplingParams) -> list[str]:
    """augury's sampling parameters as llama.cpp flags; its own defaults (top-k 40, min-p 0.05) overridden."""
    flags = [
        "--temp", str(params.temperature), "--top-k", str(params.top_k), "--top-p", str(params.top_p),
        "--min-p", str(params.min_p), "--repeat-penalty", str(params.repetition_penalty),
        "--presence-penalty", str(params.presence_penalty), "--frequency-penalty", str(params.frequency_penalty),
    ]
    if params.seed is not None:
        flags += ["--seed", str(params.seed)]
    if params.ignore_eos:
        flags.append("--ignore-eos")
    return flags


END_OF_TEXT = " [end of text]\n"  # what llama-completion prints after an end-of-sequence token


def completion_answer(stdout: str) -> tuple[str, bool]:
    """The generated text in llama-completion's stdout (prompt not displayed), and whether it hit EOS."""
    text = stdout.removesuffix("\n\n")
    return text.removesuffix(END_OF_TEXT), text.endswith(END_OF_TEXT)


def speculative_answer(stdout: str, prompt: str) -> str:
    """The generated text in llama-speculative-simple's stdout, which echoes the prompt before it."""
    start = stdout.find(prompt)
    if start < 0:
        raise AuguryError("llama-speculative-simple did not echo the prompt; cannot tell its answer apart")
    answer = stdout[start + len(prompt):]
    for tail in ("\n\n\n\n", "\n\n"):
        if answer.endswith(tail):
            return answer[: -len(tail)]
    return answer


class LlamaCppContender:
    """llama.cpp's own binaries on the target's GGUF, one process per generation, timed by llama.cpp.

    The prompt is the very text augury tokenizes (chat template applied), written
    to a file whose special tokens llama.cpp parses; its token count is checked
    against augury's, so both engines see the same prompt. Tokens are counted by
    encoding the answer with augury's tokenizer (the GGUF's own vocabulary):
    llama-speculative-simple's n_predict also counts tokens after an EOS within
    an accepted block, and llama-speculative-simple passes `-n` by up to K tokens
    (counted in its rate, cut from the output). Model loading is outside
    llama.cpp's timings, as augury's is outside its own.
    """

    kind = "peer"
    lossless = False  # other kernels, other numerics

    def __init__(
        self,
        method: str,
        target: Model,
        binary: Path,
        *,
        chat: bool,
        n_ctx: int,
        threads: int,
        k: int = 0,
        draft: Path | None = None,
    ) -> None:
        self.method = method
        self.tool = LLAMA_CPP_TOOLS[method]
        self.k = k if self.tool.spec_type else 0
        self.counterpart = COUNTERPARTS.get(method)
        self.tokenizer = target.tokenizer
        self.gguf = gguf_file(target.source, "target")
        self.draft = gguf_file(draft, "draft model") if self.tool.draft_model else None
        self.binary = binary
        self.chat = chat
        self.n_ctx = n_ctx
        self.threads = threads

    def command(self, prompt_file: Path, params: SamplingParams) -> list[str]:
        """The llama.cpp command line for one generation."""
        common = [
            str(self.binary), "-m", str(self.gguf), "-f", str(prompt_file), "-t", str(self.threads),
            "-c", str(self.n_ctx), "-b", str(self.n_ctx), "--no-escape", *_sampling_flags(params),
        ]
        if self.tool.spec_type is None:
            return [*common, "-n", str(params.max_tokens), "-no-cnv", "--simple-io", "--no-display-prompt"]
        # the speculative loop stops once it has committed more than -n tokens: -n N - 1 commits N
        spec = ["-n", str(params.max_tokens - 1), "--spec-type", self.tool.spec_type, self.tool.k_flag, str(self.k)]
        if self.draft is not None:
            spec += ["-md", str(self.draft), "-td", str(self.threads)]
        return [*common, *spec]

    def generate(self, messages: Messages, prompt_ids: list[int] | None, params: SamplingParams) -> Outcome:
        assert prompt_ids is not None
        from augury.bench.runner import prompt_text

        prompt = prompt_text(self.tokenizer, messages, self.chat)
        with tempfile.TemporaryDirectory(prefix="augury-llama-cpp-") as tmp:
            prompt_file = Path(tmp) / "prompt.txt"
            # llama.cpp drops one trailing newline of a prompt file; this one, so the prompt keeps its own
            prompt_file.write_text(prompt + "\n", encoding="utf-8")
            stdout, stderr = run_llama_cpp(self.command(prompt_file, params))
        if self.tool.spec_type is None:
            timings = parse_completion_timings(stderr)
            answer, hit_eos = completion_answer(stdout)
        else:
            timings = parse_speculative_timings(stderr)
            answer, hit_eos = speculative_answer(stdout, prompt), False
        if timings.prompt_tokens != len(prompt_ids):
            raise AuguryError(
                f"{self.tool.binary} read the prompt as {timings.prompt_tokens} tokens, augury as {len(prompt_ids)}; "
                "the two would not run the same prompt"
            )
        tokens = self.tokenizer.encode(answer, add_bos=False)
        reason = "stop" if hit_eos or len(tokens) < params.max_tokens else "length"
        # The speculative loop commits whole blocks, so it may pass max_tokens by up to K tokens: its rate
        # counts them (they are in its decode time); the output is cut for comparison with augury's.
        counted = timings.committed if timings.committed and reason == "length" else len(tokens)
        if len(tokens) > params.max_tokens:
            tokens = tokens[: params.max_tokens]
            answer = self.tokenizer.decode(tokens)
        stats = SpecStats(
            prompt_tokens=timings.prompt_tokens,
            generated_tokens=counted,
            prefill_s=timings.prefill_s,
            total_s=timings.prefill_s + timings.decode_s,
            drafted=timings.drafted,
            accepted=timings.accepted,
        )
        if timings.committed:  # each verification commits its accepted drafts plus one token
            stats.steps = timings.committed - timings.accepted
            stats.target_forwards = stats.steps + 1
        return Outcome(tokens, answer, stats, reason)


def parse_llama_bench(stdout: str) -> dict[int, float]:
    """`llama-bench -o jsonl` results: each prompt-processing test (n_gen 0) as T -> ms per forward of T tokens."""
    out: dict[int, float] = {}
    for line in stdout.splitlines():
        if not line.lstrip().startswith("{"):
            continue
        try:
            test = json.loads(line)
        except json.JSONDecodeError:
            raise AuguryError(f"llama-bench printed a malformed result line: {line[:80]}") from None
        if test.get("n_gen") == 0 and test.get("n_prompt"):
            out[int(test["n_prompt"])] = float(test["avg_ns"]) / 1e6
    if not out:
        raise AuguryError("llama-bench printed no prompt-processing results; is it llama.cpp's llama-bench?")
    return out


def llama_bench_ms(
    binary: Path, gguf: Path, rows: list[int], *, depth: int, threads: int, repetitions: int = 3
) -> dict[int, float]:
    """llama.cpp's forward of T new tokens after `depth` cached ones (its pp T test), in ms, for each T."""
    command = [str(binary), "-m", str(gguf), "-t", str(threads), "-p", ",".join(map(str, rows)), "-n", "0",
               "-d", str(depth), "-r", str(repetitions), "-o", "jsonl"]
    stdout, _ = run_llama_cpp(command)
    return parse_llama_bench(stdout)


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
