"""The speculative decoding loop.

    prefill(target, proposer)
    while not done:
        draft = proposer.propose(seq, k)             # tokens, q_draft or None
        p_target = target.forward([last] + draft)     # one pass scores every drafted position
        result = verify_chain(draft, q_draft, p_target)
        commit(result); rollback(target, proposer)    # caches move their length pointers back
        stream(result)                                # text deltas, stop strings, EOS, max_tokens

Plain decoding is the same loop with an empty draft, so both go through the
same forward shapes; with the decoder's batch-invariant padding a token's
logits are the same bits either way, and greedy output is identical.

`Request` holds everything per sequence and splits a step into `block()` (what
to feed the target) and `finish_step()` (verify and commit), so a batching
scheduler can put several requests' blocks into one target forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from augury.errors import AuguryError
from augury.metrics import SpecStats
from augury.models.loader import Model
from augury.models.tokenizer import StreamDecoder
from augury.proposers.base import Draft, Proposer, Sequence
from augury.sampling import SamplingParams, make_generator, probabilities, sample
from augury.verify import VerifyResult, verify_chain

MAX_K = 32


@dataclass
class Chunk:
    """A streamed piece of output. The last chunk has finish_reason and result set."""

    text: str
    finish_reason: str | None = None
    result: "GenerationResult | None" = None


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (max_tokens)
    stats: SpecStats = field(default_factory=SpecStats)


def check_k(k: int) -> int:
    if not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise AuguryError(f"k (draft length) must be between 1 and {MAX_K}, got {k}")
    return k


class Request:
    """One sequence being generated: its tokens, stop conditions, text and statistics."""

    def __init__(
        self,
        target: Model,
        prompt_ids: list[int],
        params: SamplingParams,
        proposer: Proposer | None = None,
        k: int = 0,
    ) -> None:
        context = target.config.context_length
        if not prompt_ids:
            raise AuguryError("the prompt is empty")
        if len(prompt_ids) >= context:
            raise AuguryError(f"prompt is {len(prompt_ids)} tokens, longer than the model's context of {context}")
        if len(prompt_ids) + params.max_tokens > context:
            raise AuguryError(
                f"prompt ({len(prompt_ids)} tokens) plus max_tokens ({params.max_tokens}) exceeds "
                f"the model's context of {context}"
            )
        self.target = target
        self.params = params
        self.proposer = proposer
        self.k = k if proposer is not None else 0
        generator = make_generator(params.seed, target.decoder.device)
        self.seq = Sequence(list(prompt_ids), params, generator=generator)
        self.stats = SpecStats(prompt_tokens=len(prompt_ids))
        self.decoder = StreamDecoder(target.tokenizer)
        self.text = ""  # output text so far (stop string cut off)
        self.emitted = 0  # characters of self.text already streamed
        self.finish_reason: str | None = None
        self.draft = Draft([])
        self.last: int | None = None  # committed token not yet in the target's cache
        self.eos_ids = frozenset() if params.ignore_eos else target.tokenizer.eos_ids
        self.holdback = max((len(s) for s in params.stop), default=1) - 1
        self.started = False  # proposer.start has run for this sequence
        self.drafted_at_length = 0  # len(seq.tokens) when the proposer last drafted (a scheduler's bookkeeping)

    # -- the step, split for batching --------------------------------------------------

    def start(self) -> None:
        """Start the proposer for this sequence (a draft model prefills the sequence so far), once.

        Drafting starts it on the first step that drafts, so a server that
        decides not to draft for a request never pays the drafter's prefill.
        """
        if self.proposer is None or self.started:
            return
        forwards = self.proposer.forwards
        self.proposer.start(self.seq)
        self.stats.draft_forwards += self.proposer.forwards - forwards
        self.started = True

    def take_first(self, logits: torch.Tensor) -> list[str]:
        """Sample the first token from the prefill's last logits [V]; returns text deltas."""
        self.stats.target_forwards += 1
        probs = probabilities(logits[None], self.params, self.seq.prompt, self.seq.output)
        token = int(probs[0].argmax()) if self.params.greedy else int(sample(probs, self.seq.generator)[0])
        return self._commit([token])

    def draft_length(self) -> int:
        """How many tokens to draft this step: k, less near max_tokens (0: plain step)."""
        if self.proposer is None:
            return 0
        return max(0, min(self.k, self.params.max_tokens - len(self.seq.output) - 1))

    def take_draft(self, draft: Draft) -> list[int]:
        """Adopt this step's draft; returns the block to feed the target: [last committed] + draft."""
        self.draft = draft
        return [self.last, *draft.tokens]

    def propose(self) -> list[int]:
        """Draft alone (see `take_draft`); a batching caller drafts for many requests at once instead."""
        draft = Draft([])
        k = self.draft_length()
        if k > 0:
            t0 = time.perf_counter()
            self.start()
            forwards = self.proposer.forwards
            draft = self.proposer.propose(self.seq, k)
            self.stats.draft_forwards += self.proposer.forwards - forwards
            self.stats.draft_s += time.perf_counter() - t0
        return self.take_draft(draft)

    def finish_step(self, logits: torch.Tensor) -> tuple[VerifyResult, list[str]]:
        """Verify the draft against the target's logits [K + 1, V]; commit; return text deltas.

        The caller must then roll the target cache back to `cache_length()`.
        """
        t0 = time.perf_counter()
        draft = self.draft
        p_target = probabilities(logits, self.params, self.seq.prompt, self.seq.output, draft.tokens)
        result = verify_chain(
            draft.tokens, draft.q_draft, p_target, greedy=self.params.greedy, generator=self.seq.generator
        )
        self.stats.verify_s += time.perf_counter() - t0
        self.stats.record_step(len(draft.tokens), result.num_accepted)
        deltas = self._commit(result.tokens)
        if self.proposer is not None and len(draft.tokens):
            t0 = time.perf_counter()
            self.proposer.on_verified(self.seq, len(draft.tokens), result.num_accepted)
            self.stats.draft_s += time.perf_counter() - t0
        return result, deltas

    def cache_length(self) -> int:
        """How many of the sequence's tokens the target cache should hold: all but the last."""
        return len(self.seq.tokens) - 1

    # -- committing ----------------------------------------------------------------------

    def _commit(self, tokens: list[int]) -> list[str]:
        """Append tokens one at a time, stopping exactly where plain decoding would."""
        deltas = []
        for token in tokens:
            if self.finish_reason is not None:
                break
            if token in self.eos_ids:
                self.finish_reason = "stop"
                break
            self.seq.tokens.append(token)
            self.last = token
            self.stats.generated_tokens += 1
            self.text += self.decoder.push([token])
            if self.params.stop:
                cut = min((i for i in (self.text.find(s) for s in self.params.stop) if i >= 0), default=-1)
                if cut >= 0:
                    self.text = self.text[:cut]
                    self.finish_reason = "stop"
            if self.finish_reason is None and len(self.seq.output) >= self.params.max_tokens:
                self.finish_reason = "length"
        safe = len(self.text) if self.finish_reason else max(self.emitted, len(self.text) - self.holdback)
        if safe > self.emitted:
            deltas.append(self.text[self.emitted : safe])
            self.emitted = safe
        return deltas

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def close(self) -> None:
        """Free the proposer's state for this sequence."""
        if self.proposer is not None:
            self.proposer.finish(self.seq)

    def result(self) -> GenerationResult:
        return GenerationResult(self.text, list(self.seq.output), self.finish_reason or "length", self.stats)


class Engine:
    """Generation with one target model and an optional proposer (None: plain decoding)."""

    def __init__(self, target: Model, proposer: Proposer | None = None, k: int = 4) -> None:
        self.target = target
        self.proposer = proposer
        self.k = check_k(k) if proposer is not None else 0

    def stream(self, prompt_ids: list[int], params: SamplingParams) -> Iterator[Chunk]:
        """Yield text as tokens are committed; the last chunk carries the result."""
        request = Request(self.target, prompt_ids, params, self.proposer, self.k)
        decoder = self.target.decoder
        device = decoder.device
        cache = decoder.new_cache(1, len(prompt_ids) + params.max_tokens + MAX_K + 8)
        t_start = time.perf_counter()
        try:
            request.start()
            logits = decoder.forward(torch.tensor([prompt_ids], device=device), cache, logits_rows=slice(-1, None))
            deltas = request.take_first(logits[0, -1])
            request.stats.prefill_s = time.perf_counter() - t_start
            yield from self._chunks(request, deltas)
            while not request.done:
                block = request.propose()
                t0 = time.perf_counter()
                logits = decoder.forward(torch.tensor([block], device=device), cache)
                request.stats.verify_s += time.perf_counter() - t0
                _, deltas = request.finish_step(logits[0])
                cache.truncate(request.cache_length())
                yield from self._chunks(request, deltas)
        finally:
            request.close()
            request.stats.total_s = time.perf_counter() - t_start
        yield Chunk("", request.finish_reason, request.result())

    @staticmethod
    def _chunks(request: Request, deltas: list[str]) -> Iterator[Chunk]:
        for text in deltas:
            yield Chunk(text)

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
