"""What the batching scheduler and its callers exchange: a request's events, the scheduler's
config, the ticket it tracks a request by, and the counters /metrics reads.

Split from scheduler.py (which runs the engine thread over them), so that the
server, the tests and the scheduler share these plain types without the
scheduler's machinery.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from augury.metrics import SpecStats
from augury.prefix_cache import DEFAULT_BLOCK
from augury.request import GenerationResult, Request, TokenLogprob
from augury.sampling import SamplingParams

log = logging.getLogger("augury.scheduler")

DEFAULT_SEQ_TOKENS = 4096  # per-row capacity when no KV budget is given (capped by the context)


# -- events the scheduler sends to a request's owner (from the engine thread) -------------


@dataclass(frozen=True)
class Admitted:
    """The request left the queue and holds a row; text follows."""


@dataclass(frozen=True)
class TextDelta:
    text: str
    # For requests that asked for logprobs: those of the tokens committed since the previous delta
    # (tokens past the end, e.g. an end-of-sequence token, excluded; the rest are in the result).
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class Finished:
    result: GenerationResult


@dataclass(frozen=True)
class Failed:
    """The request ended without a result. kind: invalid | internal | shutdown."""

    kind: str
    message: str


Event = Admitted | TextDelta | Finished | Failed


class QueueFull(Exception):
    """Every row is busy and the waiting queue is at its bound."""


# -- configuration and per-request state ---------------------------------------------------


@dataclass
class SchedulerConfig:
    max_batch: int = 16
    max_queue: int = 64
    kv_budget_tokens: int | None = None  # KV slots in the pool; None: max_batch * min(context, 4096)
    k: int = 4  # the largest draft length; the scheduler may use less
    adaptive_k: bool = True
    probe_every: int = 16
    prefix_cache_bytes: int = 0  # K/V rows of earlier sequences kept for reuse, target and drafter together; 0: none
    prefix_block: int = DEFAULT_BLOCK  # tokens per prefix cache block
    # Prompt tokens a step may feed beside the running streams' decode rows. None (auto): the planner's
    # budget from measured costs, where pieces prefill nearly as fast as whole prompts on this machine
    # (Scheduler._prompts_in_pieces), else whole prompts; 0: every prompt prefilled whole, alone, at
    # admission (also where the decoder has no ragged rows, Decoder.ragged).
    prefill_chunk: int | None = None
    # The milliseconds a step is planned to take at most, by the target's measured cost against its rows
    # (`StepBound`, step_bound.py): sequences past what fits wait in the queue, drafts and prompt pieces are
    # cut to fit. A bound on each stream's time per token, paid for in time to first token under load.
    # None: no bound (as many sequences as max_batch, the most tokens per second).
    max_step_ms: float | None = None

    def seq_capacity(self, context_length: int) -> int:
        """Tokens (prompt + output) one sequence may hold: its row of the pool."""
        if self.kv_budget_tokens is None:
            return min(context_length, DEFAULT_SEQ_TOKENS)
        return min(context_length, self.kv_budget_tokens // self.max_batch)


class Ticket:
    """A submitted request as the scheduler tracks it; the handle `cancel` takes."""

    _ids = itertools.count()

    def __init__(self, prompt_ids: list[int], params: SamplingParams, on_event: Callable[[Event], None]) -> None:
        self.id = next(self._ids)
        self.prompt_ids = prompt_ids
        self.params = params
        self.on_event = on_event
        self.cancelled = False  # set by any thread; the engine thread acts on it between steps
        self.request: Request | None = None
        self.admitted_at: float | None = None
        self.logprobs_sent = 0  # output tokens whose logprobs went out with a TextDelta

    def emit(self, event: Event) -> None:
        try:
            self.on_event(event)
        except Exception:  # a receiver that is gone must not stop the engine
            log.exception("dropping an event for request %d", self.id)


@dataclass
class SchedulerStats:
    """Counters for /metrics. Written by the engine thread only, read by anyone."""

    completed: int = 0
    cancelled: int = 0
    failed: int = 0
    rejected: int = 0  # queue full, or withdrawn after waiting too long
    prompt_tokens: int = 0
    generated_tokens: int = 0
    steps: int = 0  # batched target forwards
    decode: SpecStats = field(default_factory=SpecStats)  # one record per running sequence per step
    draft_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0
    prompts_in_pieces: int = 0  # prompts prefilled in pieces inside the steps
    last_k: int = 0

    @property
    def drafted(self) -> int:
        return self.decode.drafted

    @property
    def accepted(self) -> int:
        return self.decode.accepted

    @property
    def sequence_steps(self) -> int:
        return self.decode.steps

    @property
    def alpha(self) -> float:
        return self.decode.alpha

    @property
    def tau(self) -> float:
        return self.decode.tau
