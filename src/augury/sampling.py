"""Logits -> probabilities: the only place where sampling controls are applied.

Lossless speculative decoding guarantees the target's distribution only for
the distribution both sides were given. So the same function turns the
target's logits into p_target and the drafter's logits into q_draft, with the
same temperature, top-k, top-p, min-p and penalties, and with each drafted
position's token history (context plus the drafted tokens before it) feeding
the penalties exactly as plain decoding would see it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from augury.errors import AuguryError
from augury import verify
from augury.kernels.extension import loaded as loaded_kernel
from augury.verify import coupled_sample

MAX_TOKENS_LIMIT = 1 << 20
# Seeded sampled requests use coupled sampling unless they ask otherwise: chosen from the measured
# acceptance cost against rejection sampling (docs/benchmarks.md, coupled sampling).
COUPLED_BY_DEFAULT = True
COUPLINGS = ("auto", "coupled", "rejection")
# Temperatures below this are greedy (argmax) for every caller, the CLI and the server alike: that
# close to 0 the distribution is argmax in all but name, and dividing logits by them overflows.
GREEDY_BELOW = 1e-5


def is_greedy(temperature: float) -> bool:
    """The one rule for when a temperature means greedy decoding (see GREEDY_BELOW)."""
    return temperature < GREEDY_BELOW


@dataclass(frozen=True)
class SamplingParams:
    """What the user asked for. A temperature below GREEDY_BELOW (0 included) means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0  # >1 discourages any token already in prompt or output
    presence_penalty: float = 0.0  # subtracted once from tokens already in the output
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    max_tokens: int = 256
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0  # end-of-sequence ids cannot be sampled before this many output tokens
    eos_ids: frozenset[int] = frozenset()  # the ids min_tokens holds back (the tokenizer's; set by the caller)
    logprobs: int | None = None  # report each output token's log-probability and this many top alternatives
    constraint: object | None = None  # a grammar mask over the vocabulary (grammar.JsonObjectConstraint), or None
    # How a seeded sampled request draws its tokens: "coupled" (noise fixed by (seed, position): the same
    # text with or without speculation, whatever the drafter, K or batch), "rejection" (rejection
    # sampling from the request's generator), or "auto" (COUPLED_BY_DEFAULT). Unseeded requests use
    # rejection sampling; greedy requests need neither.
    coupling: str = "auto"

    def __post_init__(self) -> None:
        validate(self)

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)

    @property
    def coupled(self) -> bool:
        """Whether tokens come from coupled sampling (see `verify.coupled_sample`)."""
        if self.greedy or self.seed is None or self.coupling == "rejection":
            return False
        return self.coupling == "coupled" or COUPLED_BY_DEFAULT

    @property
    def load_dependent(self) -> bool:
        """Whether the text would change with K or with what a driver drafts beside the request: seeded
        sampling by rejection (its random numbers are consumed as drafts are verified). Drivers and
        drafters give such a request choices that depend on nothing but the request."""
        return self.seed is not None and not self.greedy and not self.coupled

    @property
    def mode(self) -> str:
        """greedy, coupled or rejection: what a request's usage reports."""
        return "greedy" if self.greedy else "coupled" if self.coupled else "rejection"

    @property
    def distribution_controls(self) -> tuple[float, int, float, float]:
        """All that `distribution` reads of a request (temperature, top-k, top-p, min-p): the step computes
        the rows of requests equal in these in one call."""
        return self.temperature, self.top_k, self.top_p, self.min_p

    @property
    def has_penalties(self) -> bool:
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def validate(params: SamplingParams) -> None:
    """Raise AuguryError naming the first out-of-range parameter."""
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
        value = getattr(params, name)
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise AuguryError(f"{name} must be a finite number, got {value}")
    if params.temperature < 0:
        raise AuguryError(f"temperature must be >= 0, got {params.temperature}")
    if not isinstance(params.top_k, int) or params.top_k < 0:
        raise AuguryError(f"top_k must be an integer >= 0 (0 = off), got {params.top_k}")
    if not 0.0 < params.top_p <= 1.0:
        raise AuguryError(f"top_p must be in (0, 1], got {params.top_p}")
    if not 0.0 <= params.min_p <= 1.0:
        raise AuguryError(f"min_p must be in [0, 1], got {params.min_p}")
    if params.repetition_penalty <= 0:
        raise AuguryError(f"repetition_penalty must be > 0, got {params.repetition_penalty}")
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(params, name)
        if not -2.0 <= value <= 2.0:
            raise AuguryError(f"{name} must be in [-2, 2], got {value}")
    if not isinstance(params.max_tokens, int) or not 0 < params.max_tokens <= MAX_TOKENS_LIMIT:
        raise AuguryError(f"max_tokens must be an integer in [1, {MAX_TOKENS_LIMIT}], got {params.max_tokens}")
    if any(not isinstance(text, str) or not text for text in params.stop):
        raise AuguryError(f"stop strings must be non-empty text (an empty one would stop at once), got {list(params.stop)!r}")
    if params.seed is not None and (isinstance(params.seed, bool) or not isinstance(params.seed, int)
                                    or not -(2**63) <= params.seed < 2**64):
        raise AuguryError(f"seed must be an integer in [-2**63, 2**64) (a torch generator's range), got {params.seed}")
    if params.coupling not in COUPLINGS:
        raise AuguryError(f"coupling must be one of {', '.join(COUPLINGS)}, got {params.coupling!r}")
    if params.logprobs is not None and (not isinstance(params.logprobs, int) or not 0 <= params.logprobs <= 20):
        raise AuguryError(f"logprobs must be an integer in [0, 20] (top alternatives), got {params.logprobs}")
    if not isinstance(params.min_tokens, int) or not 0 <= params.min_tokens <= params.max_tokens:
        raise AuguryError(f"min_tokens must be an integer in [0, max_tokens], got {params.min_tokens}")


def apply_penalties(
    logits: Tensor, params: SamplingParams, prompt: list[int], output: list[int], drafted: list[int]
) -> Tensor:
    """Penalize tokens already seen, row by row.

    logits: [N, V], the last N positions of output + drafted + one (as in
    `probabilities`): row i sees the prompt, the output so far and
    drafted[:len(drafted) - N + 1 + i], the tokens plain decoding would have
    produced before that position. The target's K + 1 rows after K drafted
    tokens see drafted[:i]; a drafter's one row after its drafted tokens sees
    all of them, so its q_draft is penalized exactly like the target's row there.
    """
    if not params.has_penalties:
        return logits
    n, vocab = logits.shape
    device = logits.device
    every_row = max(0, len(drafted) - n + 1)  # drafted tokens before row 0
    history = list(output) + list(drafted[:every_row])
    out_counts = torch.zeros(n, vocab, device=device)
    if history:
        out_counts += torch.bincount(torch.tensor(history, device=device), minlength=vocab)[:vocab].float()
    # Row i also sees later[:i]. Ids past the logits' width (a drafter's truncated
    # head has no column for them) are counted nowhere, as bincount's cut does above.
    later = [(row, token) for row, token in enumerate(drafted[every_row : every_row + n - 1], 1) if token < vocab]
    if later:
        steps = torch.zeros(n, vocab, device=device)
        steps[torch.tensor(later, device=device).T.unbind()] = 1.0
        out_counts += steps.cumsum(0)
    logits = logits.clone()
    if params.repetition_penalty != 1.0:
        seen = out_counts > 0
        prompt_ids = [token for token in prompt if token < vocab]
        if prompt_ids:
            seen[:, torch.tensor(prompt_ids, device=device)] = True
        penalized = torch.where(logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty)
        logits = torch.where(seen, penalized, logits)
    logits -= params.frequency_penalty * out_counts
    logits -= params.presence_penalty * (out_counts > 0).float()
    return logits


def constrained(logits: Tensor, params: SamplingParams, output: list[int] | None, drafted: list[int] | None) -> Tensor:
    """The request's grammar mask (response_format), row by row over the same history as the penalties."""
    if params.constraint is None:
        return logits
    return params.constraint.mask_logits(logits, list(output or []), list(drafted or []))


def hold_back_eos(logits: Tensor, params: SamplingParams, position: int) -> Tensor:
    """-inf at params.eos_ids in the rows before min_tokens. logits: [N, V]; row i is output position position + i.

    Masking the logits, the one transform p_target and q_draft share, keeps
    verification lossless: both sides sample the distribution without those ids.
    """
    early = min(params.min_tokens - position, logits.shape[0])
    ids = [i for i in params.eos_ids if i < logits.shape[-1]]
    if early <= 0 or not ids or len(set(ids)) >= logits.shape[-1]:  # (a vocabulary of only eos ids keeps them)
        return logits
    logits = logits.clone()
    logits[:early, torch.tensor(ids, device=logits.device)] = float("-inf")
    return logits


def shaped_logits(
    logits: Tensor,
    params: SamplingParams,
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    drafted: list[int] | None = None,
) -> Tensor:
    """Logits [N, V] after everything but temperature and truncation: penalties, the grammar mask, min_tokens.

    Rows as in `probabilities`. Extreme but valid settings (a repetition
    penalty of 1e-30) overflow to inf, and inf - inf is NaN: clamped to finite
    values, every logit shifted by the row's largest then divides to 0 or below
    at any temperature, so the softmax stays a distribution (tending to argmax
    as the temperature -> 0). The min_tokens mask comes after the clamp, so it stays -inf.
    """
    position = len(output or []) + max(0, len(drafted or []) - logits.shape[0] + 1)  # output position of row 0
    logits = constrained(apply_penalties(logits.float(), params, prompt or [], output or [], drafted or []),
                         params, output, drafted)
    if params.has_penalties:  # only penalties overflow (a clamp is a pass over 152k logits a row)
        info = torch.finfo(logits.dtype)
        logits = logits.clamp(-info.max, info.max)
    return hold_back_eos(logits, params, position)


def greedy_tokens(
    logits: Tensor,
    params: SamplingParams,
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    drafted: list[int] | None = None,
) -> Tensor:
    """A greedy request's token per row: the first largest of its shaped logits. logits: [N, V] -> [N] (int64).

    Rows as in `probabilities`, whose greedy one-hot puts its mass here. Verifying
    and committing a greedy row needs the token alone; the one-hot around it (a
    zeroed 152k-id row, then a second argmax to read it back) doubled what the
    step spent there (docs/benchmarks.md 39).
    """
    return first_largest(shaped_logits(logits, params, prompt, output, drafted))


def first_largest(logits: Tensor) -> Tensor:
    """logits.argmax(-1) for rows [N, V]: through the C++ kernel's two vectorised passes where this process
    has it loaded and the rows are float32 on the CPU (the same index: csrc/argmax.h), else torch's.

    torch's argmax took 83-115 us a 152k-wide row on a Zen 5, its amax 7 us; a greedy step reads a row
    per verified token, 16 rows a 16-sequence server step (docs/benchmarks.md 42).
    """
    kernel = loaded_kernel()
    if (kernel is None or logits.dim() != 2 or logits.dtype != torch.float32 or logits.device.type != "cpu"
            or logits.shape[0] == 0 or logits.shape[1] == 0 or logits.stride(-1) != 1):
        return logits.argmax(-1)
    index = kernel.first_largest(logits)
    unordered = index < 0  # a row with a NaN: torch names its first NaN
    if bool(unordered.any()):
        index[unordered] = logits[unordered].argmax(-1)
    return index


def probabilities(
    logits: Tensor,
    params: SamplingParams,
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    drafted: list[int] | None = None,
) -> Tensor:
    """The distribution to sample from, per row. logits: [N, V] -> probs [N, V] (fp32).

    Greedy (`is_greedy`: temperature 0 or nearly) gives a one-hot at `greedy_tokens`' argmax, so a
    caller that needs a distribution treats greedy and sampled decoding with one rule (the step
    verifies and commits greedy rows by `greedy_tokens` alone). The rows are the last N
    positions of output + drafted + one: the target's K + 1 rows after K
    drafted tokens, or a drafter's one row after the tokens it drafted so far.

    Ties at a cut are kept: top-k keeps every token whose logit equals the
    k-th largest, top-p every token whose probability equals that of the last
    token of the nucleus, min-p every token at exactly min_p times the top. So
    the kept set depends on the values alone, never on token ids or on the
    order a sort happens to leave equal values in: the same for any row count
    and any vocabulary size (a token of equal probability, wherever it sits).
    """
    if params.greedy:
        # written into zeros: one_hot builds int64 rows and converts them, 10x the time on 152k tokens
        choice = greedy_tokens(logits, params, prompt, output, drafted)
        return torch.zeros(logits.shape, device=logits.device).scatter_(-1, choice[:, None], 1.0)
    return distribution(shaped_logits(logits, params, prompt, output, drafted), params)


def distribution(logits: Tensor, params: SamplingParams) -> Tensor:
    """Shaped logits [N, V] (`shaped_logits`) -> probs [N, V] (fp32) under the temperature, top-k, top-p
    and min-p of a sampled request, as `probabilities` describes.

    Row by row: a row's bits do not depend on the rows beside it, so the step
    hands the rows of every request with the same controls
    (`SamplingParams.distribution_controls`) to one call: 16 calls of a 16-row
    sampled server step spent about 12 ms in this function's small operations
    (docs/benchmarks.md 40c, 40e).
    """
    temperature = max(params.temperature, torch.finfo(logits.dtype).tiny)  # below: 0 in fp32, and 0 / 0 is NaN
    logits = (logits - logits.amax(-1, keepdim=True)) / temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        probs = probs.masked_fill(probs < nucleus_boundary(probs, params.top_p), 0.0)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.amax(-1, keepdim=True), 0.0)
    return probs / probs.sum(-1, keepdim=True)


# Tokens sorted first, in widening stages (topk of 64 of 152k cost 0.19 ms a row here, of 1024 0.52 ms,
# of 32768 1.9 ms against 5.9 ms for the full sort); a nucleus reaching past the last stage sorts its whole
# row. At temperature 1 many nuclei hold thousands of tokens (a request's first tokens: docs/benchmarks.md 23).
NUCLEUS_CANDIDATES = (64, 1024, 32768)


def nucleus_stages(vocab: int) -> tuple[int, ...]:
    """The NUCLEUS_CANDIDATES stages `nucleus_boundary` tries on rows of `vocab` probabilities: those
    that take at most half a row (a top-k of most of a row costs about its sort)."""
    return tuple(candidates for candidates in NUCLEUS_CANDIDATES if 2 * candidates <= vocab)


def nucleus_boundary_reference(probs: Tensor, top_p: float) -> Tensor:
    """The plain top-p cut: probs [N, V] -> [N, 1] the probability of the nucleus's last token.

    The nucleus is the smallest prefix (by probability) whose mass reaches
    top_p, then every token tied with its last one: which of several equal
    tokens a sort puts first varies with the vocabulary size and the row count,
    so the cut is drawn by value, and tokens of equal probability are all kept
    or all dropped.
    """
    sorted_probs = probs.sort(dim=-1, descending=True).values
    return _cut(sorted_probs, top_p)[0]


def _cut(sorted_probs: Tensor, top_p: float) -> tuple[Tensor, Tensor]:
    """From each row's largest probabilities [N, M], descending: the last kept one [N, 1], and the
    mass before each [N, M]."""
    before = sorted_probs.cumsum(-1) - sorted_probs  # the same whatever order ties are in
    # At least the top token survives, even a top_p that is 0 in fp32 (1e-300).
    kept = (before < top_p).sum(-1, keepdim=True).clamp_min(1)
    return sorted_probs.gather(-1, kept - 1), before


def nucleus_boundary(probs: Tensor, top_p: float) -> Tensor:
    """`nucleus_boundary_reference`, bitwise, without sorting the vocabulary where the nucleus is small.

    Sorting a 151k vocabulary took about 7 ms a row here (a 5-row verification
    paid more for top-p than for the 0.5B's forward). The nucleus almost always
    lies in the largest few probabilities: topk gives them in the same order as
    a full sort, and a prefix sum over a prefix is the full sum's prefix
    (cumsum runs in order), so the cut is the same bits. Rows try the
    NUCLEUS_CANDIDATES stages in turn; a row whose nucleus may reach past the
    last is cut from its full sort. Each row's cut depends on that row alone,
    whatever rows it is batched with.

    A stage runs where it takes at most half the row: a model drafter's head on
    its 32,768 most frequent ids sorted each drafted token's whole row while
    that width skipped every stage, 1.5 ms a sampled drafted token on a 2-core
    Zen 5, about 7% of a target step (docs/benchmarks.md 38).
    """
    stages = nucleus_stages(probs.shape[-1])
    if not stages:
        return nucleus_boundary_reference(probs, top_p)
    boundary = probs.new_empty(probs.shape[0], 1)
    wide = torch.arange(probs.shape[0], device=probs.device)
    for candidates in stages:
        cut, before = _cut(torch.topk(probs[wide], candidates, dim=-1).values, top_p)
        # Inside the candidates when the mass before the last one already reaches top_p.
        inside = before[:, -1] >= top_p
        boundary[wide[inside]] = cut[inside]
        wide = wide[~inside]
        if not wide.numel():
            return boundary
    boundary[wide] = nucleus_boundary_reference(probs[wide], top_p)
    return boundary


def log_probabilities(
    logits: Tensor,
    params: SamplingParams,
    prompt: list[int] | None = None,
    output: list[int] | None = None,
    drafted: list[int] | None = None,
) -> Tensor:
    """What logprobs report, per row: logits [N, V] -> log-probabilities [N, V] (fp32).

    The model's distribution after the request's penalties, min_tokens mask and
    temperature (1 for greedy requests, whose sampling distribution is a point
    mass), before top-k / top-p / min-p truncation: the alternatives a client
    asks about keep their probabilities. Row by row, from the same logits
    rows, so speculative and plain decoding report the same bits.
    """
    logits = shaped_logits(logits, params, prompt, output, drafted)
    temperature = 1.0 if params.greedy else max(params.temperature, torch.finfo(logits.dtype).tiny)
    return torch.log_softmax((logits - logits.max(-1, keepdim=True).values) / temperature, dim=-1)


def sample(probs: Tensor, generator: torch.Generator | None) -> Tensor:
    """Draw one token per row, probs [N, V] -> [N] long: `verify.sample`, looked up at each call (the
    losslessness tests watch every draw there)."""
    return verify.sample(probs, generator)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A private RNG per request: seeded runs are reproducible whatever else runs."""
    gen = torch.Generator(device=device)
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


class Drawn(Protocol):
    """What `draw` reads of a sequence (`proposers.base.Sequence` is one): its parameters and generator."""

    params: SamplingParams
    generator: torch.Generator | None


def draw(probs: Tensor, seq: Drawn, position: int) -> int:
    """One token from probs [V] as the request draws them: argmax (greedy), coupled sampling at this
    output position, or a sample from the request's generator. Drafters draw through this too, so a
    drafted token is chosen by the same rule as the token the target would commit there."""
    params = seq.params
    if params.greedy:
        return int(probs.argmax())
    if params.coupled:
        return coupled_sample(probs, params.seed, position)
    return int(sample(probs[None], seq.generator)[0])
