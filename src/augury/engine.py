"""One request at a time through the shared step (see `step.py`).

    prefill(target, request, cache)
    while not done:
        draft(proposer, [request], [k])    # tokens, q_draft or None
        step(target, [request], cache)     # one target forward: verify, commit, roll back, feed back
        stream(deltas)                     # text deltas, stop strings, EOS, max_tokens

The batching scheduler runs the same functions for many requests at once; the
engine is its one-request special case with a fixed draft length.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from augury.models.loader import Model
from augury.proposers.base import Proposer
from augury.sampling import SamplingParams
from augury.step import MAX_K, GenerationResult, Request, check_k, draft, prefill, step

__all__ = ["Chunk", "Engine", "GenerationResult", "MAX_K", "check_k"]


@dataclass
class Chunk:
    """A streamed piece of output. The last chunk has finish_reason and result set."""

    text: str
    finish_reason: str | None = None
    result: GenerationResult | None = None


class Engine:
    """Generation with one target model and an optional proposer (None: plain decoding)."""

    def __init__(self, target: Model, proposer: Proposer | None = None, k: int = 4) -> None:
        self.target = target
        self.proposer = proposer
        self.k = check_k(k) if proposer is not None else 0

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Chunk]:
        """Yield text as tokens are committed; the last chunk carries the result."""
        request = Request(self.target, prompt_ids, params, self.proposer)
        cache = self.target.decoder.new_cache(1, len(prompt_ids) + params.max_tokens + MAX_K + 8)
        t_start = time.perf_counter()
        try:
            yield from map(Chunk, prefill(self.target, request, cache))
            while not request.done:
                if self.proposer is not None:
                    draft(self.proposer, [request], [self.k])
                report = step(self.target, [request], cache)
                if report.failures:
                    raise report.failures[0]
                yield from map(Chunk, report.deltas[0])
        finally:
            request.close()
            request.stats.total_s = time.perf_counter() - t_start
        yield Chunk("", request.finish_reason, request.result())

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
