"""One request at a time through the shared step (see `step.py`).

    prefill(target, request, cache)
    while not done:
        [k] = planner.plan([request])      # K from measured costs and acceptance (0: a plain step)
        draft(proposer, [request], [k])    # tokens, q_draft or None
        step(target, [request], cache)     # one target forward: verify, commit, roll back, feed back
        stream(deltas)                     # text deltas, stop strings, EOS, max_tokens

The batching scheduler runs the same functions for many requests at once; the
engine is its one-request special case. Both choose K with the same
`planner.Planner`, fed the target's measured cost curve (`costs.cost_curve_for`);
`adaptive=False` drafts the given K every step instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from augury.cache import slots_for
from augury.models.loader import Model
from augury.planner import Planner
from augury.proposers.base import Proposer
from augury.request import GenerationResult, Request
from augury.sampling import SamplingParams
from augury.step import MAX_K, check_k, draft, draft_free, prefill, step

__all__ = ["Chunk", "Engine", "GenerationResult", "MAX_K", "PlanNote", "check_k"]


@dataclass
class Chunk:
    """A streamed piece of output. The last chunk has finish_reason and result set."""

    text: str
    finish_reason: str | None = None
    result: GenerationResult | None = None


@dataclass
class PlanNote:
    """What the planner did over one request, and what it expected of it (`Engine.last_plan`)."""

    k_counts: list[int]  # steps run at each K (index 0: plain steps)
    settled_k: int  # the K most steps ran
    expected_gain: float  # predicted tokens/s of that plan over plain decoding's, from the cost model
    measured_gain: float  # tokens committed per second of drafting and verifying, over 1 / a plain step's time
    plain_step_s: float  # a plain step's cost, as measured
    longest_step_s: float  # a step verifying k_max drafted tokens, as measured

    def line(self) -> str:
        ks = " ".join(f"K{k}:{n}" for k, n in enumerate(self.k_counts) if n)
        return (f"planner: settled on K={self.settled_k} (steps {ks}); expected {self.expected_gain:.2f}x plain, "
                f"measured {self.measured_gain:.2f}x (a plain step {self.plain_step_s * 1e3:.1f} ms, "
                f"verifying {len(self.k_counts) - 1} drafted {self.longest_step_s * 1e3:.1f} ms)")


class Engine:
    """Generation with one target model and an optional proposer (None: plain decoding)."""

    def __init__(
        self,
        target: Model,
        proposer: Proposer | None = None,
        k: int = 4,
        *,
        adaptive: bool = False,
        curve: dict[int, float] | None = None,
    ) -> None:
        """k: the draft length (adaptive=False), or the longest the planner may choose (adaptive=True:
        per step K or 0 from the measured costs; the planner and what it measured persist across requests).
        curve: the target's forward ms by new tokens to start the planner from (default: `augury
        profile`'s for this machine, else a quick measurement, see `costs.cost_curve_for`)."""
        self.target = target
        self.proposer = proposer
        self.k = check_k(k) if proposer is not None else 0
        self.planner: Planner | None = None
        self.last_plan: PlanNote | None = None  # the planner's note on the last request
        if proposer is not None and adaptive:
            from augury.costs import cost_curve_for

            curve = curve if curve is not None else cost_curve_for(target, self.k)
            self.planner = Planner(self.k, batched=False, adaptive=True, curve=curve,
                                   free_drafts=getattr(proposer, "drafts_free", False))

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Chunk]:
        """Yield text as tokens are committed; the last chunk carries the result."""
        request = Request(self.target, prompt_ids, params, self.proposer)
        cache = self.target.decoder.new_cache(1, slots_for(len(prompt_ids), params.max_tokens))
        t_start = time.perf_counter()
        k_counts = [0] * (self.k + 1)  # steps the planner ran at each K
        try:
            yield from map(Chunk, prefill(self.target, request, cache))
            while not request.done:
                if self.proposer is not None:
                    ks = self.planner.plan([request]) if self.planner is not None else [self.k]
                    measured = draft(self.proposer, [request], ks, free_k=self.k)
                    if self.planner is not None:
                        draft_free(self.proposer, [request], self.k)
                        self.planner.trim([request])
                        self.planner.observe_draft([request], ks, measured)
                verified = len(request.draft)
                report = step(self.target, [request], cache)
                if report.failures:
                    raise report.failures[0]
                if self.planner is not None:
                    self.planner.observe_step(report, [request])
                    k_counts[verified] += 1
                yield from map(Chunk, report.deltas[0])
            if self.planner is not None:
                self.last_plan = self._plan_note(request, k_counts)
        finally:
            request.close()
            request.stats.total_s = time.perf_counter() - t_start
        yield Chunk("", request.finish_reason, request.result())

    def _plan_note(self, request: Request, k_counts: list[int]) -> "PlanNote":
        planner = self.planner
        s = request.stats
        plain_step_s = planner.costs.target_time(1, 1)
        spent = s.draft_s + s.verify_s
        measured = s.committed_in_steps / spent * plain_step_s if spent > 0 and plain_step_s > 0 else 0.0
        settled = max(range(len(k_counts)), key=lambda k: (k_counts[k], k))  # the K most steps ran
        return PlanNote(k_counts, settled, planner.expected_gain([request], settled), measured, plain_step_s,
                        planner.costs.target_time(1, 1 + self.k))

    def generate(
        self, prompt_ids: list[int], params: SamplingParams, on_text: Callable[[str], None] | None = None
    ) -> GenerationResult:
        """Run to completion; on_text receives each text delta as it is committed."""
        result = None
        for chunk in self.stream(prompt_ids, params):
            if chunk.text and on_text is not None:
                on_text(chunk.text)
            if chunk.result is not None:
                result = chunk.result
        assert result is not None
        return result
