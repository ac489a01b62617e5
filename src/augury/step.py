"""The one speculative step, and the per-sequence state it works on.

Every driver (the single-request `engine.Engine` and the batching
`scheduler.Scheduler`) runs the same three functions:

    prefill(target, request, cache)          # the prompt, the first token, eager proposers started
    while not done:
        draft(proposer, requests, ks)         # up to k tokens per sequence (0: none), batched where it can
        step(target, requests, cache)         # ONE target forward, verify, commit, roll back, feed back

`step` feeds every sequence's block ([last committed] + draft, padded to the
longest), verifies each against the target's probabilities, commits the
accepted tokens plus one recovered or bonus token, rolls the target cache
back through `KVCache.truncate`, and tells every started proposer what was
committed (with the target's hidden states of the newly cached positions to
those that asked), whether it drafted or not. Plain decoding is the same step
with empty drafts, so both go through the same forward shapes; with the
decoder's batch-invariant padding a token's logits are the same bits either
way, and greedy output is identical.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import torch
from torch import Tensor

from augury.cache import KVCache
from augury.errors import AuguryError
from augury.metrics import SpecStats
from augury.models.loader import Model
from augury.models.tokenizer import StreamDecoder
from augury.proposers.base import Draft, Proposer, Sequence, propose_batch, start_batch
from augury.sampling import SamplingParams, log_probabilities, make_generator, probabilities, sample
from augury.verify import VerifyResult, coupled_sample, verify_chain, verify_coupled

MAX_K = 32


def check_k(k: int) -> int:
    if not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise AuguryError(f"k (draft length) must be between 1 and {MAX_K}, got {k}")
    return k


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


def starts_eagerly(proposer: Proposer | None) -> bool:
    """Whether a proposer must be started with the prompt rather than on its first draft."""
    return proposer is not None and (proposer.needs_hidden or proposer.needs_every_step)


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
        self.drafted_at_length = 0  # len(seq.tokens) when the proposer last drafted (how far behind it may be)
        self.logprobs: list[TokenLogprob] | None = [] if params.logprobs is not None else None
        self.stop_after = 0  # characters of text a stop string must end past (min_tokens)

    def draft_cap(self) -> int:
        """The most tokens this sequence may draft now (0 without a proposer): room before max_tokens."""
        if self.proposer is None:
            return 0
        return max(0, self.params.max_tokens - len(self.seq.output) - 1)

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

    def block(self) -> list[int]:
        """What the target reads this step: the last committed token, then the draft."""
        return [self.seq.tokens[-1], *self.draft.tokens]

    def cache_length(self) -> int:
        """How many of the sequence's tokens the target cache should hold: all but the last."""
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


def draw(probs: Tensor, seq: Sequence, position: int) -> int:
    """One token from probs [V] as the request draws them: argmax (greedy), coupled sampling at this
    output position, or a sample from the request's generator. Drafters draw through this too."""
    params = seq.params
    if params.greedy:
        return int(probs.argmax())
    if params.coupled:
        return coupled_sample(probs, params.seed, position)
    return int(sample(probs[None], seq.generator)[0])


def _hidden_wanted(proposer: Proposer | None) -> tuple[bool, tuple[int, ...]]:
    if proposer is None or not proposer.needs_hidden:
        return False, ()
    return True, tuple(proposer.hidden_layers)


def prefill(target: Model, request: Request, cache: KVCache) -> list[str]:
    """Run the prompt into an empty single-sequence cache and commit the first token; returns text deltas.

    A proposer that needs the target's states (or every step) is started here
    with the prompt's states; others start on their first draft, so a server
    that never drafts for a request never pays for a drafter's prefill.
    """
    t0 = time.perf_counter()
    decoder = target.decoder
    cache.reset()
    wants_hidden, layers = _hidden_wanted(request.proposer)
    tokens = torch.tensor([request.seq.tokens], device=decoder.device)
    out = decoder.forward(
        tokens, cache, logits_rows=slice(-1, None), return_hidden=wants_hidden, hidden_layers=layers
    )
    logits, hidden = out if wants_hidden else (out, None)
    request.stats.target_forwards += 1
    seq = request.seq
    probs = probabilities(logits[0, -1:], request.params, seq.prompt, seq.output)
    token = draw(probs[0], seq, position=0)
    deltas = request.commit([token], logits[0, -1:])
    request.stats.prefill_s = time.perf_counter() - t0
    if starts_eagerly(request.proposer) and not request.done:
        t1 = time.perf_counter()
        request.start(hidden[0] if hidden is not None else None)
        request.stats.draft_s += time.perf_counter() - t1
    return deltas


@dataclass(frozen=True)
class DraftRound:
    """What one call of `draft` measured, for a planner's cost model."""

    rows: int  # sequences drafted together
    rounds: int  # drafter forwards per sequence (the longest draft)
    seconds: float  # drafting time, drafter starts left out
    in_step: bool  # every drafter was in step (no catch-up beyond a step's usual one or two tokens)
    started_tokens: int  # tokens the drafters started here had to prefill
    start_s: float  # seconds those starts took


def draft(proposer: Proposer, requests: list[Request], ks: list[int]) -> DraftRound:
    """Draft for several requests together (k = 0: no draft) and store each draft on its request.

    Starts a request's proposer on its first draft. Drafts for all of them in
    one batch where the proposer batches (one drafter forward per position).
    """
    t0 = time.perf_counter()
    lengths = [min(k, r.draft_cap()) for r, k in zip(requests, ks)]
    for request in requests:
        request.draft = Draft([])
    live = [(r, k) for r, k in zip(requests, lengths) if k > 0]
    if not live:
        return DraftRound(0, 0, 0.0, True, 0, 0.0)
    started = [r for r, _ in live if not r.started]
    in_step = all(r in started or len(r.seq.tokens) - r.drafted_at_length <= 2 for r, _ in live)
    if started:
        forwards = proposer.forwards
        start_batch(proposer, [r.seq for r in started])  # one drafter prefill for all, where it batches
        for request in started:
            request.stats.draft_forwards += proposer.forwards - forwards
            request.started = True
    t1 = time.perf_counter()
    forwards = proposer.forwards
    drafts = propose_batch(proposer, [r.seq for r, _ in live], [k for _, k in live])
    forwards = proposer.forwards - forwards  # each served every sequence drafted here
    t2 = time.perf_counter()
    for (request, _), proposed in zip(live, drafts):
        request.draft = proposed
        request.drafted_at_length = len(request.seq.tokens)
        request.stats.draft_s += (t2 - t0) / len(live)
        request.stats.draft_forwards += forwards
    longest = max(len(d) for d in drafts)
    return DraftRound(len(live), longest, t2 - t1, in_step, sum(len(r.seq.tokens) for r in started), t1 - t0)


@dataclass
class StepReport:
    """What one step did: a result per request (None where it failed), and its timing."""

    results: list[VerifyResult | None]
    deltas: list[list[str]]
    failures: dict[int, Exception]  # request index -> what went wrong verifying or feeding it back
    width: int  # block length every row was padded to
    forward_s: float  # the target forward
    seconds: float  # forward, verification and the proposers' feedback


def step(target: Model, requests: list[Request], cache: KVCache) -> StepReport:
    """One target forward over every request's block, then verify, commit, roll back and feed back.

    cache: row b holds requests[b]'s cached tokens (`cache_length()` of them).
    A failure while verifying one request is reported for that request alone;
    a failure of the forward itself raises.
    """
    t0 = time.perf_counter()
    decoder = target.decoder
    blocks = [r.block() for r in requests]
    width = max(len(b) for b in blocks)
    # Pad every block to the longest with its own last token: the padding rows
    # come after the real ones (causal: nobody real sees them) and are rolled
    # back below with the rejected drafts.
    rows = [b + [b[-1]] * (width - len(b)) for b in blocks]
    hidden_layers: tuple[int, ...] = ()
    wants_hidden = False
    for r in requests:
        if r.started:
            wanted, layers = _hidden_wanted(r.proposer)
            wants_hidden |= wanted
            hidden_layers = hidden_layers or layers
    out = decoder.forward(
        torch.tensor(rows, device=decoder.device), cache, return_hidden=wants_hidden, hidden_layers=hidden_layers
    )
    logits, hidden = out if wants_hidden else (out, None)
    forward_s = time.perf_counter() - t0
    results: list[VerifyResult | None] = []
    deltas: list[list[str]] = []
    failures: dict[int, Exception] = {}
    added: list[int] = []
    for b, request in enumerate(requests):
        before = len(request.seq.tokens)
        try:
            result, text = _verify_and_commit(request, logits[b, : len(blocks[b])])
        except Exception as exc:  # reported per request; the others go on
            failures[b] = exc
            result, text = None, []
        results.append(result)
        deltas.append(text)
        added.append(len(request.seq.tokens) - before)
    cache.truncate([r.cache_length() for r in requests])
    verified = time.perf_counter()
    for request in requests:
        request.stats.verify_s += verified - t0
    for b, (request, result) in enumerate(zip(requests, results)):
        if result is None or not request.started:
            continue
        states = hidden[b, : added[b]] if hidden is not None and request.proposer.needs_hidden else None
        t1 = time.perf_counter()
        try:
            request.proposer.on_step(request.seq, result, states)
        except Exception as exc:
            failures[b] = exc
        request.stats.draft_s += time.perf_counter() - t1
    seconds = time.perf_counter() - t0
    return StepReport(results, deltas, failures, width, forward_s, seconds)


def _verify_and_commit(request: Request, logits: Tensor) -> tuple[VerifyResult, list[str]]:
    """Verify a request's draft against the target's logits [K + 1, V] and commit the result."""
    draft_ = request.draft
    seq = request.seq
    p_target = probabilities(logits, request.params, seq.prompt, seq.output, draft_.tokens)
    if request.params.coupled:
        result = verify_coupled(draft_.tokens, p_target, request.params.seed, len(seq.output))
    else:
        result = verify_chain(
            draft_.tokens, draft_.q_draft, p_target, greedy=request.params.greedy, generator=seq.generator
        )
    request.stats.record_step(len(draft_.tokens), result.num_accepted)
    request.draft = Draft([])
    return result, request.commit(result.tokens, logits)
