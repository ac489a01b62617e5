"""One sequence being generated: its tokens, stop strings, text deltas, logprobs and statistics.

`step.py` works on requests (prefill, draft, step); the drivers (`engine.Engine`,
`scheduler.Scheduler`) make one per generation and read its `result()`. A
request commits tokens one at a time, so a stop string, EOS or max_tokens ends
it exactly where plain decoding would, however many tokens a step verified.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch
from torch import Tensor

from augury.errors import AuguryError
from augury.metrics import SpecStats
from augury.models.loader import Model
from augury.models.tokenizer import StreamDecoder
from augury.proposers.base import Draft, Proposer, Sequence, start_offset
from augury.sampling import SamplingParams, log_probabilities, make_generator

# A step commits the accepted drafts plus one token, so a drafter that drafted last step is one or two
# tokens behind its sequence; past this it must first catch up (feed the missed tokens), which the
# planner prices and `step.draft` reports as not in step.
IN_STEP_TOKENS = 2


@dataclass(frozen=True)
class TokenLogprob:
    """An output token's log-probability and the most likely alternatives at its position."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]  # (token id, log-probability), most likely first


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" (EOS or a stop string) or "length" (max_tokens)
    stats: SpecStats = field(default_factory=SpecStats)
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked for them


class Request:
    """One sequence being generated: its tokens, stop conditions, text, statistics and current draft."""

    def __init__(
        self, target: Model, prompt_ids: list[int], params: SamplingParams, proposer: Proposer | None = None
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
        if params.min_tokens and not params.eos_ids and not params.ignore_eos:
            # min_tokens holds back the end-of-sequence ids in the one logits transform (sampling.py)
            params = dataclasses.replace(params, eos_ids=frozenset(target.tokenizer.eos_ids))
        self.params = params
        self.proposer = proposer
        generator = make_generator(params.seed, target.decoder.device)
        self.seq = Sequence(list(prompt_ids), params, generator=generator)
        self.stats = SpecStats(prompt_tokens=len(prompt_ids))
        self.decoder = StreamDecoder(target.tokenizer)
        self.text = ""  # output text so far (stop string cut off)
        self.emitted = 0  # characters of self.text already streamed
        self.finish_reason: str | None = None
        self.draft = Draft([])
        self.eos_ids = frozenset() if params.ignore_eos else target.tokenizer.eos_ids
        self.holdback = max((len(s) for s in params.stop), default=1) - 1
        self.started = False  # proposer.start has run for this sequence
        self.proposer_seen = 0  # tokens the proposer holds: all at its last draft, or a prefill piece's end
        # Of the drafts the planner asked for (a model's, bucket 0): tokens verified and accepted. The
        # plan scales its odds by them; a matcher's drafts (stats.drafted) are another bet.
        self.planned_drafted = 0
        self.planned_accepted = 0
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        self.stop_after = 0  # characters of text a stop string must end past (min_tokens)
        # A prompt prefilled in pieces inside the steps (scheduler.py): how many of its tokens the
        # target cache holds (None once the first token is committed, or for a prompt prefilled
        # whole), the piece the next step feeds, and the pieces' target states for a proposer
        # that reads the prompt's.
        self.prompt_cached: int | None = None
        self.piece = 0
        self.prompt_states: list[Tensor] = []

    def draft_cap(self) -> int:
        """The most tokens this sequence may draft now (0 without a proposer): room before max_tokens."""
        if self.proposer is None:
            return 0
        return max(0, self.params.max_tokens - len(self.seq.output) - 1)

    def catch_up(self) -> int:
        """Tokens the proposer must feed before drafting, beyond a step's usual `IN_STEP_TOKENS` (0: in step)."""
        seen = self.proposer_seen if self.started else start_offset(self.proposer, len(self.seq.tokens))
        behind = len(self.seq.tokens) - seen
        return behind if behind > IN_STEP_TOKENS else 0

    def start(self, prompt_hidden: Tensor | None = None) -> None:
        """Start the proposer for this sequence, once (a draft model prefills the sequence so far).

        prompt_hidden: [len(seq.tokens) - 1, H'] target states, for proposers that need them.
        """
        if self.proposer is None or self.started:
            return
        forwards = self.proposer.forwards
        self.proposer.start(self.seq, prompt_hidden)
        self.stats.draft_forwards += self.proposer.forwards - forwards
        self.started = True

    @property
    def prefilling(self) -> bool:
        """Whether the prompt is still being prefilled in pieces (no token committed yet)."""
        return self.prompt_cached is not None

    def begin_prefill(self, cached: int) -> None:
        """Prefill the prompt in pieces from here; the target cache holds its first `cached` tokens."""
        if not 0 <= cached < len(self.seq.tokens) or self.seq.output:
            raise ValueError(f"cannot prefill from token {cached} of a {len(self.seq.tokens)}-token sequence")
        self.prompt_cached = cached
        self.piece = 0

    def prompt_left(self) -> int:
        """Prompt tokens not yet in the target cache (0 once prefilled)."""
        return 0 if self.prompt_cached is None else len(self.seq.tokens) - self.prompt_cached

    def block(self) -> list[int]:
        """What the target reads this step: the last committed token, then the draft; while the prompt is
        prefilled in pieces, its next `piece` tokens (none when this step gave it no piece)."""
        if self.prompt_cached is not None:
            return self.seq.tokens[self.prompt_cached : self.prompt_cached + self.piece]
        return [self.seq.tokens[-1], *self.draft.tokens]

    def cache_length(self) -> int:
        """How many of the sequence's tokens the target cache should hold: all but the last (while
        the prompt is prefilled in pieces: the prompt tokens fed so far)."""
        if self.prompt_cached is not None:
            return self.prompt_cached
        return len(self.seq.tokens) - 1

    def commit(self, tokens: list[int], logits: Tensor | None = None) -> list[str]:
        """Append tokens one at a time, stopping exactly where plain decoding would; returns text deltas.

        logits: [len(tokens), V] the target's rows the tokens were chosen from,
        for requests that report logprobs (row i is token i's position).
        """
        deltas = []
        if self.logprobs is not None and logits is not None:
            self._record_logprobs(tokens, logits)
        for token in tokens:
            if self.finish_reason is not None:
                break
            if token in self.eos_ids:
                self.finish_reason = "stop"
                break
            self.seq.tokens.append(token)
            self.stats.generated_tokens += 1
            self.text += self.decoder.push([token])
            if len(self.seq.output) == self.params.min_tokens:
                self.stop_after = len(self.text)  # a stop string must end past the min_tokens-th token
            if self.params.stop and len(self.seq.output) >= self.params.min_tokens:
                cut = min((i for i in (self.text.find(s, max(0, self.stop_after - len(s) + 1))
                                       for s in self.params.stop) if i >= 0), default=-1)
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

    def _record_logprobs(self, tokens: list[int], logits: Tensor) -> None:
        """Log-probabilities of the tokens about to be committed (those past a stop are dropped with them)."""
        seq = self.seq
        rows = log_probabilities(logits[: len(tokens)], self.params, seq.prompt, seq.output, tokens[:-1])
        top_n = self.params.logprobs or 0
        for token, row in zip(tokens, rows):
            top = torch.topk(row, top_n) if top_n else None
            alternatives = tuple(zip(top.indices.tolist(), top.values.tolist())) if top is not None else ()
            self.logprobs.append(TokenLogprob(token, float(row[token]), alternatives))

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def close(self) -> None:
        """Free the proposer's state for this sequence."""
        if self.proposer is not None and self.started:
            self.proposer.finish(self.seq)

    def result(self) -> GenerationResult:
        output = list(self.seq.output)
        logprobs = self.logprobs[: len(output)] if self.logprobs is not None else None
        return GenerationResult(self.text, output, self.finish_reason or "length", self.stats, logprobs)
