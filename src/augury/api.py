"""The Python API most users reach for first: `augury.load(...)` and `LLM.generate` / `LLM.stream`.

    import augury
    llm = augury.load("qwen2.5-coder-1.5b-instruct", draft_method="model", k=4)
    print(llm.generate([{"role": "user", "content": "Hello"}], max_tokens=32).text)
    for piece in llm.stream("def fib(n):", temperature=0.7, seed=1):
        print(piece, end="")

The CLI (`augury generate`, `augury demo`, `augury serve`) loads through the
same `load`; everything below it (the step, the drafters, verification) is the
same for every caller, so the API can never decode differently from the CLI.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from augury.engine import Engine, GenerationResult
from augury.models.loader import Model, load_model
from augury.models.tokenizer import build_prompt_ids
from augury.proposers import Proposer, build_proposer, check_options
from augury.proposers.options import DEFAULT_METHOD
from augury.sampling import SamplingParams
from augury.step import check_k

Prompt = str | list[dict]  # raw text, or chat messages [{"role": ..., "content": ...}]


class LLM:
    """A target model and its drafter (None: plain decoding), ready to generate."""

    def __init__(
        self, target: Model, proposer: Proposer | None, *, k: int = 4, method: str = "plain", adaptive: bool = True
    ) -> None:
        """k: the longest draft; adaptive: the planner picks K (or a plain step) per step from measured
        costs and acceptance, as the server does; False drafts k every step."""
        self.target = target
        self.proposer = proposer
        self.k = check_k(k) if proposer is not None else 0
        self.method = method
        self._engine = Engine(target, proposer, k=k if proposer is not None else 1, adaptive=adaptive)

    @property
    def last_plan(self):
        """The planner's note on the last request (`engine.PlanNote`), None without a planner."""
        return self._engine.last_plan

    @property
    def tokenizer(self):
        return self.target.tokenizer

    def encode(self, prompt: Prompt, *, chat: bool | None = None, system: str | None = None) -> list[int]:
        """Token ids of a prompt: chat messages (or a string with chat=True) through the model's chat
        template, where only the template's own markers are special tokens; a string as raw text otherwise."""
        if isinstance(prompt, str):
            return build_prompt_ids(self.tokenizer, prompt, bool(chat), system)
        messages = ([{"role": "system", "content": system}] if system else []) + list(prompt)
        return self.tokenizer.encode_chat(messages)

    def generate(self, prompt: Prompt, *, chat: bool | None = None, **sampling: object) -> GenerationResult:
        """The whole completion (text, token ids, finish reason, statistics).

        sampling: any `SamplingParams` field (temperature, top_p, max_tokens, seed, stop, ...).
        """
        return self.generate_ids(self.encode(prompt, chat=chat), SamplingParams(**sampling))

    def generate_ids(
        self, prompt_ids: list[int], params: SamplingParams, on_text: Callable[[str], None] | None = None
    ) -> GenerationResult:
        """The completion of prompt token ids; on_text receives each text delta as it is committed."""
        return self._engine.generate(prompt_ids, params, on_text=on_text)

    def stream(self, prompt: Prompt, *, chat: bool | None = None, **sampling: object) -> Iterator[str]:
        """Text pieces as tokens are committed; `last_result` holds the statistics once it is exhausted."""
        self.last_result: GenerationResult | None = None
        for chunk in self._engine.stream(self.encode(prompt, chat=chat), SamplingParams(**sampling)):
            if chunk.text:
                yield chunk.text
            if chunk.result is not None:
                self.last_result = chunk.result


def load(
    target: str | Model = "qwen2.5-coder-1.5b-instruct",
    *,
    draft_method: str = DEFAULT_METHOD,
    k: int = 4,
    dtype: str = "bf16",
    device: str = "cpu",
    offline: bool = False,
    exact: bool = True,
    weights: str | None = None,
    adaptive: bool = True,
    **options: object,
) -> LLM:
    """Load a target (a known name, a .gguf file, a Hugging Face folder, or a loaded Model) and its drafter.

    draft_method: plain, model, ngram, suffix, hybrid (the default), cross, layerskip,
    quantized; weights: "gguf" (a GGUF file's own low-bit blocks, the default
    on CPUs where the kernel runs) or "bf16" (dequantized); options: that method's own options (see
    `augury.proposers.options`), e.g. draft="qwen2.5-coder-0.5b-instruct" or
    ngram_max=3. An option the method does not read is an AuguryError. adaptive: K per step from
    measured costs (see `LLM`).
    """
    check_options(draft_method, options)  # a mistyped option fails before gigabytes load
    model = target if isinstance(target, Model) else load_model(
        target, dtype=dtype, device=device, offline=offline, exact=exact, weights=weights
    )
    proposer = build_proposer(draft_method, model, options, dtype=dtype, device=device, offline=offline)
    return LLM(model, proposer, k=k, method=draft_method, adaptive=adaptive)
