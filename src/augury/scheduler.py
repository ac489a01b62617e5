"""Continuous batching for the server: one engine thread, many requests, shared target forwards.

One thread owns the models. Requests wait in a bounded queue, join the running
batch between steps and leave it the moment they finish or are cancelled.
A step is the engine loop of `engine.Engine.stream`, done for every running
sequence at once:

    blocks = [request.propose() for request in running]     # [last committed] + draft
    logits = target.forward(blocks padded to the longest)    # ONE forward, rows = sequences
    for each sequence b:
        request.finish_step(logits[b, :len(block_b)])        # verify, commit, text deltas
        cache length of row b = request.cache_length()        # roll back rejected drafts

KV memory is one preallocated pool of `max_batch` rows, each long enough for
the longest sequence the server admits (kv_budget_tokens / max_batch slots).
Running sequences occupy rows 0..n-1, so each step runs on a view of exactly
those rows (no copies); when a sequence leaves, the last row's entries move
into the hole. Padding rows past a sequence's real block write garbage after
its committed length, which the rollback forgets. A prompt is prefilled alone,
straight into its row, never batched with other sequences: with the decoder's
batch-invariant padding every sequence then gets the same logits, bit for bit,
as it would decoding alone, and greedy output equals `Engine.generate`.

Speculation that never hurts. Verifying K drafted tokens is nearly free for
one sequence, but a batch of sequences can fill the hardware, and then every
drafted token costs real target time (plus the drafter's own time). Before
each step the scheduler picks the draft length K that maximizes expected
tokens per second, from measured costs:

    rate(K) = sum_r E_r(k_r) / (t_target(n, 1 + max_r k_r) + t_draft(K))
    E_r(k)  = 1 + sum_{i<k} reach[i] * accept_r[i]   (accepted prefix + the target's token)
    k_r     = min(K, tokens request r may still draft)

- t_target(rows, T): seconds of one verification step (the batched target
  forward plus verifying every row) with `rows` sequences and blocks of T
  tokens. The median of its last five samples once a (rows, T) has been seen
  three times; before that, a least-squares line t = a + b * rows * T over recent steps
  (the work is mostly proportional to the rows the matmuls see). With too
  little data the line is flat, i.e. verification looks free, so the
  scheduler drafts and learns.
- t_draft(K): drafting rounds times the measured seconds of one round. A
  drafter that batches (a draft model) runs one forward per drafted position
  for all m drafting sequences: max_r k_r rounds of t_round(m), measured per m
  the same way as t_target (a forward over a few rows costs about one row's).
  Others draft one sequence at a time: sum_r D(k_r) rounds of t_round(1).
- reach[i], accept[i] (`DraftOdds`): measured server-wide per drafted
  position: how often the drafter drafts at least i + 1 tokens when allowed
  (a confident-drafting drafter stops early when it doubts), and how often
  the first i + 1 are then all accepted; D(k) = sum_{i<k} reach[i] tokens are
  drafted. Per position, because acceptance is strongly correlated along a
  draft (one independent rate badly underestimates long drafts). A request's
  accept_r is the server's scaled by its own acceptance rate over the server's,
  shrunk towards the server's for requests with little history.
- catch-up: a drafter that is L tokens behind (it never drafted, or sat out
  steps) must first feed them, at its measured prefill seconds per token; that
  one-off cost buys drafting for the rest of the request, so it is spread over
  the steps the request has left.
- margin: with several sequences, drafting must be predicted 15% faster than
  plain decoding before it is chosen; the estimates are noisy, and a wrong
  "draft" costs speed where a wrong "don't" only forgoes it.
- alone: a single sequence chooses between K = 0 and K = k_max only. A
  drafter that stops itself when it doubts sizes each draft token by token;
  a lower common K only cut its confident drafts short.

K = 0 is plain decoding, so whenever drafting does not pay the scheduler stops
drafting. A request's drafter starts (a draft model prefills the sequence)
only on the first step that drafts for it, so requests served while drafting
does not pay cost no drafter time; that one-off start is kept out of t_round.
The first k_max + 1 steps try every K once (K_max down to 0) for one sequence,
so the line is fitted from real spread from the start; afterwards every `probe_every` steps
it tries a neighbour of its current choice (K - 1 or K + 1 in turn), drafting
for one sequence (whose drafter already runs if any), so the estimates it steers by stay current
without paying for long drafts under a load where plain decoding is best;
while the plan keeps its K from one probe to the next the interval doubles,
up to 8x (a probe away from the best K costs speed: alone, a K = 0 probe
forgoes a step's drafted tokens; under load, a K = 1 probe widens the whole
batch's block), and a changed plan brings it back to `probe_every`. Seeded sampled
requests always draft the configured K, alone: with a seed the output must
not depend on load.
"""

from __future__ import annotations

import collections
import itertools
import logging
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from augury.errors import AuguryError
from augury.engine import GenerationResult, Request, check_k
from augury.models.loader import Model
from augury.proposers.base import Draft, Proposer, batches, propose_batch
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
    drafted: int = 0
    accepted: int = 0
    sequence_steps: int = 0  # one per running sequence per step
    committed_in_steps: int = 0
    steps: int = 0  # batched target forwards
    draft_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0
    last_k: int = 0
    last_rows: int = 0

    @property
    def alpha(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tau(self) -> float:
        return self.committed_in_steps / self.sequence_steps if self.sequence_steps else 0.0


# -- the cost model -------------------------------------------------------------------------


class ShapeCosts:
    """Seconds of one kind of forward by shape, from measurements (see the module doc).

    The median of a shape's last few samples once it has been seen a few
    times; before that a discounted least-squares line t = a + b * size over
    every observation (one sample of a shape, often a warm-up step that also
    paid for first-touch memory, is too noisy to plan on alone). A median, not
    a running mean: on a shared machine a step now and then takes far longer,
    and a mean that such a hiccup pushed up can keep the planner off that
    shape, which it then re-measures only at the next probe.
    """

    MIN_SAMPLES = 3
    RECENT = 5  # samples per shape the median is taken over (at least MIN_SAMPLES)

    def __init__(self, forget: float = 0.97) -> None:
        self.forget = forget  # per-observation discount in the least-squares line
        self.recent: dict[object, collections.deque] = {}  # shape -> its last RECENT samples
        self._sums = [0.0] * 5  # discounted sums of w, w*n, w*n^2, w*t, w*n*t

    def observe(self, shape: object, size: float, seconds: float) -> None:
        self.recent.setdefault(shape, collections.deque(maxlen=self.RECENT)).append(seconds)
        new = (1.0, size, size * size, seconds, size * seconds)
        self._sums = [self.forget * s + x for s, x in zip(self._sums, new)]

    def line(self) -> tuple[float, float]:
        """(a, b) of t = a + b * size; b = 0 until observations of different sizes were seen."""
        w, sn, snn, st, snt = self._sums
        if w == 0.0:
            return 0.0, 0.0
        spread = w * snn - sn * sn
        b = (w * snt - sn * st) / spread if spread > 1e-9 * max(w * snn, 1e-30) else 0.0
        b = max(b, 0.0)
        a = max((st - b * sn) / w, 0.0)
        return a, b

    def time(self, shape: object, size: float) -> float:
        recent = self.recent.get(shape, ())
        if len(recent) >= self.MIN_SAMPLES:
            return statistics.median(recent)
        a, b = self.line()
        return a + b * size


class StepCosts:
    """What a step costs: the batched target forward by (rows, block), and one drafting round
    (one drafter forward for the sequences drafting together) by how many sequences it serves."""

    # Before a drafting round over several sequences was measured, assume each
    # extra sequence adds a quarter of a one-sequence round (a weight-bound
    # forward over 4 rows cost about 1.1x one row here, over 8 about 2x).
    EXTRA_ROW_SHARE = 0.25

    def __init__(self) -> None:
        self.target = ShapeCosts()
        self.draft = ShapeCosts()
        self.catch_up_per_token = 0.0  # drafter seconds per token it must catch up on (its prefill rate)

    def observe_target(self, rows: int, block: int, seconds: float) -> None:
        self.target.observe((rows, block), rows * block, seconds)

    def target_time(self, rows: int, block: int) -> float:
        return self.target.time((rows, block), rows * block)

    def observe_draft(self, rows: int, rounds: int, seconds: float) -> None:
        """`rounds` drafting rounds over `rows` sequences each took `seconds` in all."""
        self.draft.observe(rows, rows, seconds / rounds)

    def draft_round_time(self, rows: int) -> float:
        if rows > 1 and not any(shape > 1 for shape in self.draft.recent):
            return self.draft.time(1, 1) * (1 + self.EXTRA_ROW_SHARE * (rows - 1))
        return self.draft.time(rows, rows)

    def observe_catch_up(self, tokens: int, seconds: float) -> None:
        per_token = seconds / tokens
        old = self.catch_up_per_token
        self.catch_up_per_token = per_token if old == 0.0 else 0.8 * old + 0.2 * per_token


class ProbeTimer:
    """When to probe: every `every` steps at first, the interval doubling (up to
    8x) each time the plan is found unchanged at a probe, and reset to `every`
    when it changed. 0 never probes."""

    MAX_STRETCH = 8

    def __init__(self, every: int) -> None:
        self.every = every
        self.gap = every
        self.next = every
        self.plan_at_last: int | None = None

    def due(self, step: int, planned_k: int) -> bool:
        """Whether step `step` probes (and if so, when the next one will)."""
        if not self.every or step < self.next:
            return False
        steady = planned_k == self.plan_at_last
        self.gap = min(2 * self.gap, self.MAX_STRETCH * self.every) if steady else self.every
        self.plan_at_last = planned_k
        self.next = step + self.gap
        return True


@dataclass(frozen=True)
class DraftOdds:
    """What drafting delivers, per drafted position i (0-based), as measured.

    reach[i]: probability the drafter drafts at least i + 1 tokens when allowed
    more than i (a confident-drafting drafter stops early when it doubts).
    accept[i]: probability the first i + 1 drafted tokens are all accepted,
    given at least i + 1 were drafted. Measured per position rather than
    derived from one acceptance rate: acceptance is strongly correlated along a
    draft (a drafter on a roll stays right), which a single independent rate
    badly underestimates for long drafts.
    """

    reach: tuple[float, ...]
    accept: tuple[float, ...]

    @classmethod
    def independent(cls, alpha: float, k_max: int, continue_rate: float = 1.0) -> "DraftOdds":
        """Each drafted token accepted with rate alpha independently (the prior before measurements)."""
        return cls(
            tuple(continue_rate**i for i in range(k_max)), tuple(alpha ** (i + 1) for i in range(k_max))
        )

    def tokens(self, k: int) -> float:
        """Expected tokens one verification commits with k allowed: accepted prefix + the target's own."""
        return 1.0 + sum(r * a for r, a in zip(self.reach[:k], self.accept[:k]))

    def drafted(self, k: int) -> float:
        """Expected tokens drafted with k allowed."""
        return sum(self.reach[:k])

    def scaled(self, factor: float) -> "DraftOdds":
        """The same odds with acceptance scaled (a request accepting more or less than the server's mean)."""
        return DraftOdds(self.reach, tuple(min(1.0, a * factor) for a in self.accept))


class DraftTally:
    """Server-wide per-position counts behind `DraftOdds`, with a prior for positions rarely seen."""

    PRIOR_ALPHA = 0.7  # acceptance assumed before anything was measured
    PRIOR_WEIGHT = 4.0  # observations' worth of trust in the prior

    def __init__(self, k_max: int) -> None:
        self.allowed = [0] * k_max  # steps that allowed at least i + 1 tokens
        self.drafted = [0] * k_max  # steps that drafted at least i + 1
        self.accepted = [0] * k_max  # steps whose first i + 1 drafted tokens were all accepted

    def record_draft(self, allowed: int, drafted: int) -> None:
        for i in range(allowed):
            self.allowed[i] += 1
        for i in range(drafted):
            self.drafted[i] += 1

    def record_verified(self, accepted: int) -> None:
        for i in range(accepted):
            self.accepted[i] += 1

    def odds(self) -> DraftOdds:
        """Measured odds, each position pulled towards a prior worth PRIOR_WEIGHT observations.

        A position's prior continues the chain measured before it: the odds at
        i - 1 times the conditional acceptance measured from i - 2 to i - 1
        (PRIOR_ALPHA at the first position). The independent prior alpha^(i+1)
        made deep positions look poor exactly where they are drafted least, so
        a planner that trusted it kept drafting short and never measured the
        long drafts a confident drafter gets right (at one sequence here: K
        1-2 chosen, 12.8-13.3 tok/s, against 15.0 with K = 4 always).
        """
        w = self.PRIOR_WEIGHT
        reach = tuple((d + w) / (n + w) for d, n in zip(self.drafted, self.allowed))
        accept: list[float] = []
        for a, d in zip(self.accepted, self.drafted):
            if not accept:
                prior = self.PRIOR_ALPHA
            else:
                before = accept[-2] if len(accept) > 1 else 1.0
                prior = accept[-1] * min(1.0, accept[-1] / max(before, 1e-9))
            accept.append((a + w * prior) / (d + w))
        return DraftOdds(reach, tuple(accept))


def plan_step(
    costs: StepCosts,
    odds: list[DraftOdds],
    caps: list[int],
    fixed: list[int | None],
    k_max: int,
    *,
    batched: bool = False,
    behind: list[int] | None = None,
    margin: float = 0.0,
    choices: Sequence[int] | None = None,
) -> list[int]:
    """Per-sequence draft lengths for one step: the common K that maximizes expected tokens per second.

    odds: what drafting delivers for each sequence; caps: most tokens each may
    draft now; fixed: a draft length a sequence must use (seeded sampling) or
    None. batched: the drafter serves all drafting sequences in one forward per
    round (rounds = the longest draft), rather than one sequence at a time.
    behind: tokens each sequence's drafter must first catch up on (all of them
    if it never drafted). That one-off cost buys drafting for the rest of the
    request, so it is spread over the steps the request has left (caps[r] + 1
    tokens at E_r(k) a step).
    margin: how much faster than plain decoding (K = 0) drafting must be
    predicted to be before it is chosen (0.1 = 10%).
    choices: the common Ks to consider (default 0..k_max).
    """
    rows = len(odds)
    behind = behind or [0] * rows
    best, best_rate = [0] * rows, -1.0
    for k in range(k_max + 1) if choices is None else sorted(choices):
        ks = [min(f if f is not None else k, cap) for f, cap in zip(fixed, caps)]
        tokens = sum(o.tokens(kr) for o, kr in zip(odds, ks))
        drafting = [(o, kr) for o, kr in zip(odds, ks) if kr > 0]
        if not drafting:
            draft_s = 0.0
        elif batched and len(drafting) > 1:
            draft_s = max(kr for _, kr in drafting) * costs.draft_round_time(len(drafting))
        else:
            draft_s = sum(o.drafted(kr) for o, kr in drafting) * costs.draft_round_time(1)
        for o, kr, late, cap in zip(odds, ks, behind, caps):
            if kr > 0 and late:
                steps_left = max(1.0, (cap + 1) / o.tokens(kr))
                draft_s += late * costs.catch_up_per_token / steps_left
        seconds = costs.target_time(rows, 1 + max(ks)) + draft_s
        rate = tokens / max(seconds, 1e-9)
        # Drafting must beat plain decoding by a margin, not a hair: the
        # estimates are noisy, and a wrong "draft" costs speed while a wrong
        # "don't" only forgoes it.
        needed = best_rate * (1 + margin) if k > 0 and not any(best) else best_rate * (1 + 1e-9)
        if rate > needed:
            best, best_rate = ks, rate
    return best


# -- the scheduler ----------------------------------------------------------------------------


class Scheduler:
    """Continuous batching over one target model and an optional proposer (see the module doc)."""

    # With several sequences, drafting must be predicted this much faster than
    # plain decoding: batched steps have more ways to go wrong (catch-ups,
    # drafter starts, uneven drafts) than the cost model sees.
    DRAFT_MARGIN = 0.15
    PRIOR_ALPHA = DraftTally.PRIOR_ALPHA  # acceptance assumed before any request was measured
    PRIOR_WEIGHT = DraftTally.PRIOR_WEIGHT  # drafted tokens' worth of trust in the server-wide rate

    def __init__(self, target: Model, proposer: Proposer | None, config: SchedulerConfig) -> None:
        if config.max_batch < 1:
            raise AuguryError(f"max batch must be >= 1, got {config.max_batch}")
        if config.max_queue < 0:
            raise AuguryError(f"max queue must be >= 0, got {config.max_queue}")
        self.target = target
        self.proposer = proposer
        self.config = config
        self.k_max = check_k(config.k) if proposer is not None else 0
        self.batched = proposer is not None and batches(proposer)
        self.tally = DraftTally(self.k_max)
        self.capacity = config.seq_capacity(target.config.context_length)
        if self.capacity < 16:
            raise AuguryError(
                f"KV budget of {config.kv_budget_tokens} tokens leaves {self.capacity} per sequence for "
                f"{config.max_batch} rows; raise --kv-budget-tokens or lower --max-batch"
            )
        # A row also takes the block verified after the sequence's last token
        # (new_cache adds room for the decoder's row padding).
        self.pool = target.decoder.new_cache(config.max_batch, self.capacity + self.k_max + 1)
        self.costs = StepCosts()
        self.stats = SchedulerStats()
        self._lock = threading.Condition()
        self._waiting: collections.deque[Ticket] = collections.deque()
        self._running: list[Ticket] = []  # running[i] owns pool row i
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._steps = 0
        self._probes = 0
        self._planned_k = 0  # the K the cost model chose last (probes try its neighbours)
        self._probe_timer = ProbeTimer(config.probe_every)

    # -- public, any thread -------------------------------------------------------------

    def start(self) -> None:
        """Start the engine thread."""
        if self._thread is None:
            self._stopping = False
            self._thread = threading.Thread(target=self._loop, name="augury-engine", daemon=True)
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the engine thread; requests still queued or running fail with kind 'shutdown'."""
        with self._lock:
            self._stopping = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def submit(self, prompt_ids: list[int], params: SamplingParams, on_event: Callable[[Event], None]) -> Ticket:
        """Queue a request. Raises AuguryError if it can never fit, QueueFull if the queue is full.

        on_event is called from the engine thread: Admitted, then TextDelta*,
        then Finished or Failed (or only Failed if it never got a row).
        """
        need = len(prompt_ids) + params.max_tokens
        if need > self.capacity:
            raise AuguryError(
                f"prompt ({len(prompt_ids)} tokens) plus max_tokens ({params.max_tokens}) is {need} tokens; "
                f"this server holds at most {self.capacity} per sequence"
            )
        ticket = Ticket(list(prompt_ids), params, on_event)
        with self._lock:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            # Tickets that free rows will take at the next step boundary do not count as queued.
            free_rows = self.config.max_batch - len(self._running)
            if len(self._waiting) >= self.config.max_queue + free_rows:
                self.stats.rejected += 1
                raise QueueFull(f"the queue is full ({self.config.max_queue} waiting); try again later")
            self._waiting.append(ticket)
            self._lock.notify_all()
        return ticket

    def cancel(self, ticket: Ticket) -> None:
        """Drop a request: at once if it is queued, before the next step if it is running."""
        with self._lock:
            ticket.cancelled = True
            try:
                self._waiting.remove(ticket)
            except ValueError:
                return
            self.stats.cancelled += 1

    def withdraw(self, ticket: Ticket) -> bool:
        """Take a ticket back if it is still queued (the caller gave up waiting): True if it was.

        False means a row already took it; Admitted is on its way. Decided
        under the queue's lock, so a ticket is never both withdrawn and run.
        """
        with self._lock:
            try:
                self._waiting.remove(ticket)
            except ValueError:
                return False
            ticket.cancelled = True
            self.stats.rejected += 1
            return True

    @property
    def queue_length(self) -> int:
        return len(self._waiting)

    @property
    def running(self) -> int:
        return len(self._running)

    # -- the engine thread ----------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._stopping and not self._waiting and not self._running:
                        self._lock.wait()
                    if self._stopping:
                        break
                    free = self.config.max_batch - len(self._running)
                    admitted = [self._waiting.popleft() for _ in range(min(free, len(self._waiting)))]
                for ticket in admitted:
                    self._admit(ticket)
                self._drop_cancelled()
                if self._running:
                    self._step()
        finally:
            self._shutdown()

    def _admit(self, ticket: Ticket) -> None:
        """Give a ticket the next free row and prefill its prompt there, alone."""
        if ticket.cancelled:
            self.stats.cancelled += 1
            return
        ticket.emit(Admitted())
        t0 = time.perf_counter()
        try:
            request = Request(self.target, ticket.prompt_ids, ticket.params, self.proposer, self.k_max)
        except AuguryError as exc:
            self.stats.failed += 1
            ticket.emit(Failed("invalid", str(exc)))
            return
        ticket.request = request
        ticket.admitted_at = t0
        row = len(self._running)
        self._running.append(ticket)
        try:
            # The proposer starts (and a draft model prefills) on the first
            # step that drafts for this request: under load it may never.
            view = self.pool.rows(row, row + 1)
            view.lengths = [0]
            decoder = self.target.decoder
            tokens = torch.tensor([ticket.prompt_ids], device=decoder.device)
            logits = decoder.forward(tokens, view, logits_rows=slice(-1, None))
            deltas = request.take_first(logits[0, -1])
        except AuguryError as exc:
            self._release(ticket, Failed("invalid", str(exc)))
            return
        except Exception:
            log.exception("prefill failed for request %d", ticket.id)
            self._release(ticket, Failed("internal", "internal error during prefill"))
            return
        elapsed = time.perf_counter() - t0
        request.stats.prefill_s = elapsed
        self.stats.prefill_s += elapsed
        self.stats.prompt_tokens += len(ticket.prompt_ids)
        self._emit_deltas(ticket, deltas)
        if request.done:
            self._release(ticket)

    def _drop_cancelled(self) -> None:
        for ticket in [t for t in self._running if t.cancelled]:
            self._release(ticket, cancelled=True)

    def _alpha(self, request: Request) -> float:
        prior = self.stats.alpha if self.stats.drafted >= 32 else self.PRIOR_ALPHA
        s = request.stats
        return (s.accepted + self.PRIOR_WEIGHT * prior) / (s.drafted + self.PRIOR_WEIGHT)

    def _plan(self) -> list[int]:
        """Draft length per running sequence for this step."""
        requests = [t.request for t in self._running]
        caps = [max(0, r.params.max_tokens - len(r.seq.output) - 1) for r in requests]
        if self.k_max == 0:
            return [0] * len(requests)
        fixed = [self.k_max if (r.params.seed is not None and not r.params.greedy) else None for r in requests]
        self._steps += 1
        if not self.config.adaptive_k:
            return [min(self.k_max, cap) for cap in caps]
        alone = len(requests) == 1
        # A sequence alone drafts all it may or not at all: a drafter that stops
        # itself when it doubts already sizes each draft, token by token, better
        # than averages can; capping it lower only cut confident drafts short
        # (one client, 6 prompts, in process: 1.27x over plain while the planner
        # chose K of 1-4 alone, 1.34x with 0 or 4). Probes and plans both pick from these.
        candidates = (0, self.k_max) if alone else tuple(range(self.k_max + 1))
        probe = None
        if self._steps <= self.k_max + 1:
            probe = self.k_max + 1 - self._steps  # warm-up: every K once
        elif self._probe_timer.due(self._steps, self._planned_k):
            # Next to the current choice, alternately below and above: enough to
            # follow the best K as costs and acceptance drift, and far cheaper
            # under load than trying the longest drafts when K = 0 is best.
            self._probes += 1
            lower = [k for k in candidates if k < self._planned_k]
            higher = [k for k in candidates if k > self._planned_k]
            neighbours = lower[-1:] + higher[:1]
            probe = neighbours[self._probes % len(neighbours)]
        if probe is not None:
            # A probe is a measurement, not a decision: it drafts for one
            # sequence only, one whose drafter already runs if any, so it never
            # sets off a burst of drafter prefills. Only the warm-up, or a
            # sequence alone (it keeps its drafter for the rest of its run),
            # may start a drafter for a probe: among several sequences with no
            # drafter running, a later probe is skipped, as one drafter start
            # there cost as much as several steps and bought one measurement.
            may_start = self._steps <= self.k_max + 1 or alone
            chosen = next((i for i, r in enumerate(requests) if r.started), 0 if may_start else None)
            if chosen is None:
                return [min(f, cap) if f is not None else 0 for f, cap in zip(fixed, caps)]
            return [
                min(f if f is not None else (probe if i == chosen else 0), cap)
                for i, (f, cap) in enumerate(zip(fixed, caps))
            ]
        odds = self.tally.odds()
        server_alpha = self.stats.alpha if self.stats.drafted >= 32 else self.PRIOR_ALPHA
        ks = plan_step(
            self.costs, [odds.scaled(self._alpha(r) / max(server_alpha, 1e-3)) for r in requests], caps, fixed,
            self.k_max, batched=self.batched, behind=[self._behind(r) for r in requests],
            margin=0.0 if alone else self.DRAFT_MARGIN, choices=candidates,
        )
        self._planned_k = max((k for k, f in zip(ks, fixed) if f is None), default=self._planned_k)
        return ks

    @staticmethod
    def _behind(request: Request) -> int:
        """Tokens the request's drafter must catch up on before drafting, beyond a step's usual one or two."""
        behind = len(request.seq.tokens) - request.drafted_at_length
        return behind if behind > 2 else 0

    def _step(self) -> None:
        """One batched draft-verify-commit step over every running sequence."""
        ks = self._plan()
        t0 = time.perf_counter()
        drafts, rounds = self._draft(ks)
        if not self._running:
            return
        draft_s = time.perf_counter() - t0
        blocks = {t.id: t.request.take_draft(drafts.get(t.id, Draft([]))) for t in self._running}

        running = list(self._running)
        width = max(len(blocks[t.id]) for t in running)
        # Pad every block to the longest with its own last token: the padding
        # rows come after the real ones (causal: nobody real sees them) and are
        # rolled back below with the rejected drafts.
        rows = [blocks[t.id] + [blocks[t.id][-1]] * (width - len(blocks[t.id])) for t in running]
        decoder = self.target.decoder
        view = self.pool.rows(0, len(running))
        view.lengths = [t.request.cache_length() for t in running]
        t1 = time.perf_counter()
        try:
            logits = decoder.forward(torch.tensor(rows, device=decoder.device), view)
        except Exception:
            log.exception("batched target forward failed (%d rows x %d)", len(running), width)
            for ticket in running:
                self._release(ticket, Failed("internal", "internal error in the target forward"))
            return
        forward_s = time.perf_counter() - t1
        finished = []
        for b, ticket in enumerate(running):
            request = ticket.request
            n = len(blocks[ticket.id])
            try:
                result, deltas = request.finish_step(logits[b, :n])
            except Exception:
                log.exception("verification failed for request %d", ticket.id)
                finished.append((ticket, Failed("internal", "internal error while verifying")))
                continue
            request.stats.verify_s += forward_s
            self.stats.sequence_steps += 1
            self.stats.committed_in_steps += result.num_accepted + 1
            self.stats.drafted += result.num_drafted
            self.stats.accepted += result.num_accepted
            self.tally.record_verified(result.num_accepted)
            self._emit_deltas(ticket, deltas)
            if request.done:
                finished.append((ticket, None))
        verify_s = time.perf_counter() - t1
        self.costs.observe_target(len(running), width, verify_s)
        for rows, count, seconds in rounds:
            self.costs.observe_draft(rows, count, seconds)
        self.stats.steps += 1
        self.stats.draft_s += draft_s
        self.stats.verify_s += verify_s
        self.stats.last_k = width - 1
        self.stats.last_rows = len(running)
        for ticket, failure in finished:
            self._release(ticket, failure)

    def _draft(self, ks: list[int]) -> tuple[dict[int, Draft], list[tuple[int, int, float]]]:
        """Draft for every running sequence that drafts this step.

        Returns drafts by ticket id and, per batch drafted, (sequences served
        together, drafting rounds, seconds), for the cost model: a drafter's
        one-off start (its prefill of a sequence) is left out of those seconds.
        Sequences draft together in one batch where the proposer batches;
        seeded sampled requests draft alone, so that their output never
        depends on which other requests shared the drafter's forward.
        """
        drafting = []
        for ticket, k in zip(self._running, ks):
            ticket.request.k = k
            if ticket.request.draft_length() > 0:
                drafting.append(ticket)
        if not drafting:
            return {}, []
        seeded = [t for t in drafting if t.request.params.seed is not None and not t.request.params.greedy]
        if self.batched:
            groups = [[t] for t in seeded] + [[t for t in drafting if t not in seeded]]
        else:
            groups = [[t] for t in drafting]
        drafts: dict[int, Draft] = {}
        rounds = []
        for group in groups:
            if not group:
                continue
            t0 = time.perf_counter()
            try:
                started = [t for t in group if not t.request.started]
                for ticket in started:
                    ticket.request.start()
                # Rounds are timed only when every drafter was in step: a catch-up
                # after steps without drafting is a small prefill, costed per token.
                in_step = all(t in started or not self._behind(t.request) for t in group)
                t1, forwards = time.perf_counter(), self.proposer.forwards
                if started:
                    self.costs.observe_catch_up(sum(len(t.request.seq.tokens) for t in started), t1 - t0)
                lengths = [t.request.draft_length() for t in group]
                out = propose_batch(self.proposer, [t.request.seq for t in group], lengths)
                forwards = self.proposer.forwards - forwards  # each served every sequence of the group
            except Exception:
                log.exception("drafting failed for request(s) %s", [t.id for t in group])
                for ticket in group:
                    self._release(ticket, Failed("internal", "internal error while drafting"))
                continue
            elapsed = time.perf_counter() - t0
            for ticket, draft, length in zip(group, out, lengths):
                drafts[ticket.id] = draft
                ticket.request.drafted_at_length = len(ticket.request.seq.tokens)
                ticket.request.stats.draft_s += elapsed / len(group)
                ticket.request.stats.draft_forwards += forwards
                self.tally.record_draft(length, len(draft))
            longest = max((len(d) for d in out), default=0)
            if longest and in_step:
                rounds.append((len(group), longest, time.perf_counter() - t1))
        return drafts, rounds

    def _emit_deltas(self, ticket: Ticket, deltas: list[str]) -> None:
        for text in deltas:
            ticket.emit(TextDelta(text))

    def _release(self, ticket: Ticket, failure: Failed | None = None, *, cancelled: bool = False) -> None:
        """Take a ticket out of the batch: close it, report how it ended, free its row at once."""
        request = ticket.request
        row = self._running.index(ticket)
        last = len(self._running) - 1
        if row != last:
            # Keep running sequences in rows 0..n-1: move the last one into the hole.
            mover = self._running[last]
            n = mover.request.cache_length()
            for keys, values in zip(self.pool.keys, self.pool.values):
                keys[row, :, :n] = keys[last, :, :n]
                values[row, :, :n] = values[last, :, :n]
            self._running[row] = mover
        self._running.pop()
        try:
            request.close()
        except Exception:
            log.exception("closing request %d failed", ticket.id)
        request.stats.total_s = time.perf_counter() - (ticket.admitted_at or time.perf_counter())
        ticket.request = None
        self.stats.generated_tokens += request.stats.generated_tokens
        if cancelled:
            self.stats.cancelled += 1
        elif failure is not None:
            self.stats.failed += 1
            ticket.emit(failure)
        else:
            self.stats.completed += 1
            ticket.emit(Finished(request.result()))

    def _shutdown(self) -> None:
        for ticket in list(self._running):
            self._release(ticket, Failed("shutdown", "the server is shutting down"))
        with self._lock:
            waiting, self._waiting = list(self._waiting), collections.deque()
        for ticket in waiting:
            ticket.emit(Failed("shutdown", "the server is shutting down"))
