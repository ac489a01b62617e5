"""The server's drafting for one batched step: who drafts, in which groups, and drafters' prefill in pieces.

The scheduler asks `BatchDrafter.draft` for the running requests and the
draft lengths the planner chose; each draft lands on its request, ready for
the target's verification. Three rules live here:

- Requests draft together in one batch where the proposer batches; seeded
  requests sampled by rejection draft alone, so that their output never
  depends on which other requests shared the drafter's forward (coupled
  ones cannot depend on it).
- With prompts in pieces, a model drafter's own prefill of a new prompt
  comes in pieces too, under the same budget as the target's, oldest
  request first: a request whose drafter is further behind than a step's
  budget is fed a piece of it instead of drafting, so no step waits for a
  whole drafter prefill of a long prompt.
- A drafter that raises fails the requests it drafted for, each alone
  (logged); the others go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from augury.planner import Planner
from augury.proposers.base import Proposer
from augury.step import DraftRound, draft, draft_free, prefill_drafters, starts_eagerly
from augury.tickets import Failed, Ticket

log = logging.getLogger("augury.scheduler")


class BatchDrafter:
    """Drafting for the scheduler's running tickets (see the module doc)."""

    def __init__(self, proposer: Proposer | None, planner: Planner, *, chunked: bool, budget: Callable[[int], int],
                 fail: Callable[[Ticket, Failed], None]) -> None:
        """chunked: prompts enter in pieces; budget(decode_rows): the prompt tokens a step beside that many
        decode rows may feed (the scheduler's, shared with the target's pieces); fail(ticket, failure): take
        a ticket whose drafter raised out of the batch."""
        self.proposer = proposer
        self.planner = planner
        self.chunked = chunked
        self.budget = budget
        self.fail = fail

    def draft(self, tickets: list[Ticket], ks: list[int]) -> None:
        """Draft for every ticket that drafts this step (each draft lands on its request), then the free
        drafts where the plan gave none, then what of each draft pays (`Planner.trim`)."""
        drafting = [(t, k) for t, k in zip(tickets, ks) if min(k, t.request.draft_cap()) > 0]
        drafting = self._drafters_in_pieces(drafting, len(tickets))
        seeded = [(t, k) for t, k in drafting if t.request.params.load_dependent]
        shared = [(t, k) for t, k in drafting if (t, k) not in seeded]
        groups = [[tk] for tk in seeded] + ([shared] if self.planner.batched else [[tk] for tk in shared])
        for group in filter(None, groups):
            members, ks = [t for t, _ in group], [k for _, k in group]
            measured = self._run(members, "drafting",
                                 lambda: draft(self.proposer, [t.request for t in members], ks, free_k=self.planner.k_max))
            if measured is not None:
                self.planner.observe_draft([t.request for t in members], ks, measured)
        live = [t for t in tickets if t.request is not None]  # a failed drafter's tickets were released
        if self.planner.adaptive:  # free drafts where the plan gave none; then what of each draft pays (one width)
            for ticket in live:  # one request at a time (a matcher's lookup is its own): a raise fails only it
                self._run([ticket], "drafting", lambda: draft_free(self.proposer, [ticket.request], self.planner.k_max))
            live = [t for t in live if t.request is not None]
        self.planner.trim([t.request for t in live])

    def _run(self, tickets: list[Ticket], what: str, run: Callable[[], DraftRound]) -> DraftRound | None:
        """run() on these tickets' drafter; if it raises, each of them fails alone (logged) and None comes back."""
        try:
            return run()
        except Exception:
            log.exception("%s failed for request(s) %s", what, [t.id for t in tickets])
            for ticket in tickets:
                self.fail(ticket, Failed("internal", "internal error while drafting"))
            return None

    def _drafters_in_pieces(self, drafting: list[tuple[Ticket, int]], decode_rows: int) -> list[tuple[Ticket, int]]:
        """Drafters too far behind to catch up inside one step get a piece of their prefill instead of drafting.

        The request drafts from the step where the rest fits in one piece.
        Seeded requests sampled by rejection start whole, as their drafts
        (hence their output) must not depend on the load. Returns the
        (ticket, K) pairs that draft this step.
        """
        if not self.chunked or starts_eagerly(self.proposer) or not hasattr(self.proposer, "prefill_batch"):
            return drafting
        budget = self.budget(decode_rows)
        behind = [(t, k) for t, k in drafting
                  if t.request.catch_up() > budget and not t.request.params.load_dependent]
        if not behind:
            return drafting
        pieces: list[tuple[Ticket, int]] = []
        for ticket, _ in sorted(behind, key=lambda tk: tk[0].request.seq.id):  # sequences are numbered as made
            if budget > 0:
                pieces.append((ticket, min(ticket.request.catch_up(), budget)))
                budget -= pieces[-1][1]
        tickets = [t for t, _ in pieces]
        measured = self._run(tickets, "a drafter's prefill piece", lambda: prefill_drafters(
            self.proposer, [t.request for t in tickets], [n for _, n in pieces]))
        if measured is not None:
            self.planner.observe_draft([], [], measured)
        return [(t, k) for t, k in drafting if (t, k) not in behind]
