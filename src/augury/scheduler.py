"""Continuous batching for the server: one engine thread, many requests, shared target forwards.

One thread owns the models. Requests wait in a bounded queue, join the running
batch between steps and leave it the moment they finish or are cancelled.
Each step is `step.step` over every running sequence at once, with the draft
lengths the planner (`planner.Planner`) chose:

    ks = planner.plan(running)                 # K per sequence, from measured costs
    draft(proposer, group, ks) per group        # seeded sampled requests draft alone
    step(target, running, pool rows 0..n-1)    # ONE forward, verify, commit, roll back, feed back

KV memory is one preallocated pool of `max_batch` rows, each long enough for
the longest sequence the server admits (kv_budget_tokens / max_batch slots).
Running sequences occupy rows 0..n-1, so each step runs on a view of exactly
those rows (no copies); when a sequence leaves, the last row moves into the
hole (`KVCache.move_row`). A prompt either enters in pieces inside the steps
(`prefill_chunk`: each step feeds `Request.piece` of its tokens beside the
decode rows, the native layer's ragged rows; `_give_pieces` shares the budget)
or is prefilled whole, alone, straight into its row at admission. Either way
no row's bits depend on what ran beside it, and greedy output equals
`Engine.generate` (for prompts past 64 tokens in pieces: equals the same
prompt in pieces at any budget; README's contract).

With a prefix cache (`prefix_cache.PrefixCache`, `prefix_cache_bytes` > 0) a
new prompt's longest cached start is copied into its row and only the rest is
prefilled. A prompt's rows are stored right after its prefill (requests
admitted together share a system prompt), a completed sequence's rows when it
leaves (the next turn of a chat starts with them); a cancelled or failed
request's own blocks are dropped at once. A model drafter that takes a cache
(`use_prefix_cache`) gets its own, with the budget split by bytes per token.
Requests whose drafter reads the prompt's target states (heads) skip it.

Who drafts in which group, and a model drafter's own prefill in pieces (no
step waits for a whole drafter prefill of a long prompt), are
`batch_draft.BatchDrafter`'s.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable

from augury.batch_draft import BatchDrafter
from augury.cache import KVCache
from augury.costs import rows_curve
from augury.errors import AuguryError
from augury.models.loader import Model
from augury.planner import Planner
from augury.prefix_cache import PrefixCache, free_memory, kv_bytes_per_token
from augury.proposers.base import Proposer, batches
from augury.request import Request, TokenLogprob
from augury.sampling import SamplingParams
from augury.step import check_k, needs_prompt_states, prefill, step
from augury.step_bound import StepBound
from augury.tickets import (
    Admitted,
    Event,
    Failed,
    Finished,
    QueueFull,
    SchedulerConfig,
    SchedulerStats,
    TextDelta,
    Ticket,
)

# The events, the config and a request's ticket live in tickets.py; callers import them from here too.
__all__ = ["Admitted", "Event", "Failed", "Finished", "QueueFull", "Scheduler", "SchedulerConfig", "SchedulerStats",
           "TextDelta", "Ticket"]

log = logging.getLogger("augury.scheduler")

def _cost_curve(target: Model) -> dict[int, float] | None:
    """The target's verification cost curve as `augury profile` measured it on this machine, if it did."""
    from augury.costs import load_cost_curve

    try:
        return load_cost_curve(target)
    except (OSError, ValueError):
        return None


class Scheduler:
    """Continuous batching over one target model and an optional proposer (see the module doc)."""

    def __init__(self, target: Model, proposer: Proposer | None, config: SchedulerConfig) -> None:
        if config.max_batch < 1:
            raise AuguryError(f"max batch must be >= 1, got {config.max_batch}")
        if config.max_queue < 0:
            raise AuguryError(f"max queue must be >= 0, got {config.max_queue}")
        self.target = target
        self.proposer = proposer
        self.config = config
        k_max = check_k(config.k) if proposer is not None else 0
        if config.max_step_ms is not None and not (math.isfinite(config.max_step_ms) and config.max_step_ms > 0):
            raise AuguryError(f"max step time must be a positive number of milliseconds, got {config.max_step_ms}")
        curve = _cost_curve(target)
        if config.max_step_ms is not None and len(curve or ()) < 2:  # a bound needs the cost of rows at once
            curve = rows_curve(target)
        self.planner = Planner(
            k_max, batched=proposer is not None and batches(proposer), free_drafts=getattr(proposer, "drafts_free", False),
            adaptive=config.adaptive_k, probe_every=config.probe_every, curve=curve,
        )
        if config.prefill_chunk is not None and (not isinstance(config.prefill_chunk, int) or config.prefill_chunk < 0):
            raise AuguryError(f"prefill chunk must be a whole number of tokens >= 0, got {config.prefill_chunk}")
        self.chunked = self._prompts_in_pieces(target, config)
        # A prompt's piece with nothing else in the step: the decoder's row-attention limit (the
        # rows it computes row by row, the native layer's) unless a fixed chunk was asked for.
        self.piece_limit = config.prefill_chunk or target.decoder.row_attention_limit
        self.bound = None if config.max_step_ms is None else StepBound(
            config.max_step_ms / 1000.0, self.planner.costs, batched=self.planner.batched,
            limit=config.max_batch * (k_max + 1) + self.piece_limit,
        )
        self.drafter = BatchDrafter(proposer, self.planner, chunked=self.chunked, budget=self._step_budget,
                                    fail=self._release)
        self.capacity = config.seq_capacity(target.config.context_length)
        if self.capacity < 16:
            raise AuguryError(
                f"KV budget of {config.kv_budget_tokens} tokens leaves {self.capacity} per sequence for "
                f"{config.max_batch} rows; raise --kv-budget-tokens or lower --max-batch"
            )
        # A row also takes the block verified after the sequence's last token
        # (new_cache adds room for the decoder's row padding).
        self._check_pool_fits(target, config, self.capacity + k_max + 1)
        self.pool = target.decoder.new_cache(config.max_batch, self.capacity + k_max + 1)
        self.prefix, self.draft_prefix = self._prefix_caches(config)
        self.stats = SchedulerStats()
        self._lock = threading.Condition()
        self._waiting: collections.deque[Ticket] = collections.deque()
        self._running: list[Ticket] = []  # running[i] owns pool row i
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._seats = self._count_seats()  # recounted by the engine thread before each admission

    @staticmethod
    def _check_pool_fits(target: Model, config: SchedulerConfig, row_tokens: int) -> None:
        """A one-line error where the KV pool would take more memory than is free now (an absurd
        --max-batch asked the allocator for 158 GB and died in a traceback)."""
        probe = target.decoder.new_cache(1, 1)
        need = kv_bytes_per_token(probe) * config.max_batch * row_tokens
        free = free_memory(probe.keys[0].device)
        if free is not None and need > free:
            raise AuguryError(
                f"the KV cache for {config.max_batch} rows of {row_tokens} tokens needs {need / 2**30:.1f} GB, more "
                f"than the {free / 2**30:.1f} GB free; lower --max-batch or --kv-budget-tokens"
            )

    @staticmethod
    def _prompts_in_pieces(target: Model, config: SchedulerConfig) -> bool:
        """Whether prompts enter the steps in pieces: where the decoder has ragged rows and chunking is on;
        for auto (None), where pieces prefill nearly as fast as a whole prompt on this machine
        (`costs.prefill_rates`, measured once), since otherwise every prompt would cost serving
        throughput (docs/benchmarks.md section 10)."""
        if config.prefill_chunk == 0 or not target.decoder.ragged:
            return False
        if config.prefill_chunk is not None:
            return True
        from augury.costs import pieces_pay, prefill_rates

        pieces, whole = prefill_rates(target)
        chunked = pieces_pay(pieces, whole)
        log.info("prompts prefill at %.0f tok/s in pieces, %.0f whole: %s", pieces, whole,
                 "in pieces inside the steps" if chunked else "whole, as they are admitted (--prefill-chunk N forces pieces)")
        return chunked

    def _prefix_caches(self, config: SchedulerConfig) -> tuple[PrefixCache | None, PrefixCache | None]:
        """The target's prefix cache and a model drafter's, the budget split by their bytes per token."""
        if config.prefix_cache_bytes < 0:
            raise AuguryError(f"prefix cache budget must be >= 0 bytes, got {config.prefix_cache_bytes}")
        if config.prefix_cache_bytes == 0 or needs_prompt_states(self.proposer):
            return None, None
        target_bytes = kv_bytes_per_token(self.pool)
        draft_bytes = getattr(self.proposer, "prefix_token_bytes", lambda: 0)()
        share = config.prefix_cache_bytes * target_bytes // (target_bytes + draft_bytes)
        target = PrefixCache(share, config.prefix_block)
        keys = self.pool.keys[0]  # [B, H_kv, T, D]: the arena takes the whole budget now, not as it fills
        target.reserve(len(self.pool.keys), keys.shape[1], keys.shape[3], keys.dtype, keys.device)
        if not draft_bytes:
            return target, None
        drafter = PrefixCache(config.prefix_cache_bytes - share, config.prefix_block)
        self.proposer.use_prefix_cache(drafter)
        return target, drafter

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
            free_rows = max(0, self.seats - len(self._running))
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

    @property
    def prefilling(self) -> int:
        """Running requests whose prompt is still being fed in pieces."""
        requests = [t.request for t in list(self._running)]  # read once: the engine thread may clear one
        return sum(1 for r in requests if r is not None and r.prefilling)

    # -- the engine thread ----------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while True:
                with self._lock:
                    while not self._stopping and not self._waiting and not self._running:
                        self._lock.wait()
                    if self._stopping:
                        break
                    free = self._count_seats() - len(self._running)
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
            request = Request(self.target, ticket.prompt_ids, ticket.params, self.proposer)
        except AuguryError as exc:
            self.stats.failed += 1
            ticket.emit(Failed("invalid", str(exc)))
            return
        ticket.request = request
        ticket.admitted_at = t0
        row = len(self._running)
        self._running.append(ticket)
        view = self.pool.rows(row, row + 1)
        try:
            cached = 0
            if self.prefix is not None:
                cached = self.prefix.take(request.seq.tokens, len(request.seq.tokens) - 1, view)
            if self.chunked:
                # The prompt enters in pieces inside the coming steps (_give_pieces), beside the running
                # streams' decode rows; _prompt_done finishes what the lines below do for a whole prompt.
                view.truncate([cached])
                request.begin_prefill(cached)
                self.stats.prompt_tokens += len(ticket.prompt_ids)
                return
            deltas = prefill(self.target, request, view, cached)
        except AuguryError as exc:
            self._release(ticket, Failed("invalid", str(exc)))
            return
        except Exception:
            log.exception("prefill failed for request %d", ticket.id)
            self._release(ticket, Failed("internal", "internal error during prefill"))
            return
        self.stats.prefill_s += time.perf_counter() - t0
        self.stats.prompt_tokens += len(ticket.prompt_ids)
        self._prompt_done(ticket, view, deltas)

    def _prompt_done(self, ticket: Ticket, view: KVCache, deltas: list[str]) -> None:
        """A prompt is in its row and the first token committed: keep its rows for later prompts, send the
        first text, end the request if that token ended it."""
        if self.prefix is not None and not ticket.cancelled:
            self.prefix.store(ticket.request.seq.prompt, view, owner=ticket.request.seq.id)
        self._emit_deltas(ticket, deltas)
        if ticket.request.done:
            self._release(ticket)

    def _drop_cancelled(self) -> None:
        for ticket in [t for t in self._running if t.cancelled]:
            self._release(ticket, cancelled=True)

    def _step(self) -> None:
        """One batched draft-verify-commit step over every running sequence, with pieces of the prompts
        being prefilled in the same forward."""
        decoding = [t for t in self._running if not t.request.prefilling]
        t0 = time.perf_counter()
        if decoding:
            ks = self.planner.plan([t.request for t in decoding])
            prefilling = len(self._running) - len(decoding)  # a row kept for each prompt being prefilled
            if self.bound is not None:
                ks = self.bound.fit(ks, [t.request.params.load_dependent for t in decoding], prefilling, drafted=False)
            self.drafter.draft(decoding, ks)
            if self.bound is not None:
                self._fit_drafts([t for t in decoding if t.request is not None], prefilling)
        if not self._running:
            return
        draft_s = time.perf_counter() - t0
        running = list(self._running)
        requests = [t.request for t in running]
        self._give_pieces([r for r in requests if r.prefilling],
                          sum(len(r.block()) for r in requests if not r.prefilling))
        try:
            report = step(self.target, requests, self.pool.rows(0, len(running)))
        except Exception:
            log.exception("batched target forward failed (%d rows)", len(running))
            for ticket in running:
                self._release(ticket, Failed("internal", "internal error in the target forward"))
            return
        finished, prompted = [], []
        for b, (ticket, result) in enumerate(zip(running, report.results)):
            if b in report.failures:
                log.error("verification failed for request %d", ticket.id, exc_info=report.failures[b])
                finished.append((ticket, Failed("internal", "internal error while verifying")))
                continue
            if result is None:  # a prompt piece; the last one committed the first token
                if not ticket.request.prefilling:
                    prompted.append((ticket, b))
                continue
            self.stats.decode.record_step(result.num_drafted, result.num_accepted)
            self._emit_deltas(ticket, report.deltas[b])
            if ticket.request.done:
                finished.append((ticket, None))
        self.stats.steps += 1
        self.stats.draft_s += draft_s
        share = report.prompt_rows / max(report.rows, 1)
        self.stats.prefill_s += report.seconds * share
        self.stats.verify_s += report.seconds * (1 - share)
        if report.width:
            self.stats.last_k = report.width - 1
        for ticket, b in prompted:  # before any release moves rows
            self.stats.prompts_in_pieces += 1
            if self.prefix is not None and not ticket.cancelled:
                self.prefix.store(ticket.request.seq.prompt, self.pool.rows(b, b + 1), owner=ticket.request.seq.id)
            self._emit_deltas(ticket, report.deltas[b])
            if ticket.request.done:
                finished.append((ticket, None))
        for ticket, failure in finished:
            self._release(ticket, failure)
        self.planner.observe_step(report, requests, rest_s=time.perf_counter() - t0 - draft_s - report.forward_s)

    def _step_budget(self, decode_rows: int) -> int:
        """Prompt tokens (the target's pieces, and a drafter's) a step beside decode_rows rows may feed: the fixed
        --prefill-chunk, else the planner's from measured costs; under --max-step-ms, of the rows left."""
        budget = self.config.prefill_chunk or self.planner.prompt_budget(decode_rows, self.piece_limit)
        return budget if self.bound is None else self.bound.pieces(budget, decode_rows)

    @property
    def seats(self) -> int:
        """Sequences that may run at once, as the engine thread last counted them (`_count_seats`)."""
        return self._seats

    def _count_seats(self) -> int:
        """--max-batch, fewer under --max-step-ms (`StepBound.seats`; the rest wait in the queue). The engine
        thread's alone: its costs change each step (a median read while a step appends can raise)."""
        self._seats = self.config.max_batch if self.bound is None else self.bound.seats(self.config.max_batch)
        return self._seats

    def _fit_drafts(self, decoding: list[Ticket], prefilling: int) -> None:
        """Cut the trimmed drafts to a step within --max-step-ms beside a row for each of `prefilling` prompts
        (`StepBound.fit`: a seeded rejection-sampled request's stays whole)."""
        requests = [t.request for t in decoding]
        keep = self.bound.fit([len(r.draft) for r in requests], [r.params.load_dependent for r in requests],
                              prefilling, drafted=True)
        for request, k in zip(requests, keep):
            request.draft = request.draft.truncated(k)

    def _give_pieces(self, prefilling: list[Request], decode_rows: int) -> None:
        """How many prompt tokens each prompt being prefilled feeds this step (`Request.piece`).

        Half the step's budget (fixed, or the planner's from measured costs)
        goes to the prompt admitted first, so prompts are served in order and
        none starves; the rest to the shortest prompts first, so a short
        request is not held behind a long one for the long one's whole prefill.
        """
        if not prefilling:
            return
        budget = self._step_budget(decode_rows)
        for request in prefilling:
            request.piece = 0
        oldest = min(prefilling, key=lambda r: r.seq.id)  # sequences are numbered as they are made
        oldest.piece = min(oldest.prompt_left(), max(1, budget // 2))
        budget -= oldest.piece
        for request in sorted(prefilling, key=Request.prompt_left):
            more = min(request.prompt_left() - request.piece, budget)
            request.piece += more
            budget -= more

    def _emit_deltas(self, ticket: Ticket, deltas: list[str]) -> None:
        if not deltas:
            return
        request = ticket.request
        logprobs: tuple[TokenLogprob, ...] = ()
        if request.logprobs is not None:
            committed = len(request.seq.output)
            logprobs = tuple(request.logprobs[ticket.logprobs_sent : committed])
            ticket.logprobs_sent = committed
        for i, text in enumerate(deltas):
            ticket.emit(TextDelta(text, logprobs if i == 0 else ()))

    def _release(self, ticket: Ticket, failure: Failed | None = None, *, cancelled: bool = False) -> None:
        """Take a ticket out of the batch: close it, report how it ended, free its row at once."""
        request = ticket.request
        row = self._running.index(ticket)
        kept = failure is None and not cancelled
        if self.prefix is not None and kept:
            self.prefix.store(request.seq.tokens[: request.cache_length()], self.pool, row, owner=request.seq.id)
        last = len(self._running) - 1
        if row != last:
            # Keep running sequences in rows 0..n-1: move the last one into the hole.
            self.pool.move_row(last, row)
            self._running[row] = self._running[last]
        self._running.pop()
        try:
            request.close()
        except Exception:
            log.exception("closing request %d failed", ticket.id)
        for prefix in (self.prefix, self.draft_prefix):
            if prefix is not None:
                prefix.settle(request.seq.id, kept)
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
