"""The one speculative step, run on `request.Request`s.

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

import time
from dataclasses import dataclass

import torch
from torch import Tensor

from augury.cache import KVCache
from augury.errors import AuguryError
from augury.models.loader import Model
from augury.proposers.base import Draft, Proposer, propose_batch, start_batch, start_offset
from augury.request import Request
from augury.sampling import distribution, draw, greedy_tokens, probabilities, shaped_logits
from augury.verify import VerifyResult, verify_chain, verify_coupled, verify_greedy

MAX_K = 32


def check_k(k: int) -> int:
    if not isinstance(k, int) or not 1 <= k <= MAX_K:
        raise AuguryError(f"k (draft length) must be between 1 and {MAX_K}, got {k}")
    return k


def starts_eagerly(proposer: Proposer | None) -> bool:
    """Whether a proposer must be started with the prompt rather than on its first draft."""
    return proposer is not None and (proposer.needs_hidden or proposer.needs_every_step)


def needs_prompt_states(proposer: Proposer | None) -> bool:
    """Whether a proposer is started with the target's states of the whole prompt (so no prompt row may be skipped)."""
    return proposer is not None and proposer.needs_hidden


def _hidden_wanted(proposer: Proposer | None) -> tuple[bool, tuple[int, ...]]:
    if proposer is None or not proposer.needs_hidden:
        return False, ()
    return True, tuple(proposer.hidden_layers)


def prefill(target: Model, request: Request, cache: KVCache, cached: int = 0) -> list[str]:
    """Run the prompt into a single-sequence cache and commit the first token; returns text deltas.

    A proposer that needs the target's states (or every step) is started here
    with the prompt's states; others start on their first draft, so a server
    that never drafts for a request never pays for a drafter's prefill.
    cached: the cache already holds the rows of the prompt's first `cached`
    tokens (a prefix cache's), so only the rest runs; 0: the cache is emptied.
    """
    t0 = time.perf_counter()
    decoder = target.decoder
    wants_hidden, layers = _hidden_wanted(request.proposer)
    if cached:
        if wants_hidden:
            raise ValueError("a proposer that reads the prompt's states needs the whole prompt prefilled")
        if cache.lengths != [cached] or not 0 < cached < len(request.seq.tokens):
            raise ValueError(f"a cache holding {cache.lengths} rows for {cached} cached of {len(request.seq.tokens)}")
    else:
        cache.reset()
    tokens = torch.tensor([request.seq.tokens[cached:]], device=decoder.device)
    logits, hidden = decoder.forward_states(tokens, cache, logits_rows=slice(-1, None),
                                            states=layers if wants_hidden else None)
    request.stats.target_forwards += 1
    deltas = _first_token(request, logits[0, -1:])
    request.stats.prefill_s = time.perf_counter() - t0
    _start_eagerly(request, hidden[0] if hidden is not None else None)
    return deltas


def _first_token(request: Request, last: Tensor) -> list[str]:
    """Commit the token drawn from the prompt's last row (logits [1, V]); returns text deltas."""
    seq, params = request.seq, request.params
    if params.greedy:
        token = int(greedy_tokens(last, params, seq.prompt, seq.output)[0])
    else:
        token = draw(probabilities(last, params, seq.prompt, seq.output)[0], seq, position=0)
    return request.commit([token], last)


def _start_eagerly(request: Request, prompt_hidden: Tensor | None) -> None:
    """Start a proposer that starts with the prompt (prompt_hidden: [prompt length, H'], for those that
    read the prompt's states)."""
    if starts_eagerly(request.proposer) and not request.done:
        t1 = time.perf_counter()
        request.start(prompt_hidden)
        request.stats.draft_s += time.perf_counter() - t1


@dataclass(frozen=True)
class DraftRound:
    """What one call of `draft` measured, for a planner's cost model."""

    rows: int  # sequences drafted together
    rounds: int  # drafter forwards per sequence (the longest draft)
    seconds: float  # drafting time, drafter starts left out
    in_step: bool  # every drafter was in step (no catch-up beyond a step's usual one or two tokens)
    started_tokens: int  # tokens the drafters started here had to prefill
    start_s: float  # seconds those starts took
    forwards: int = 0  # drafter forwards the drafting ran (0: no model ran, a matcher drafted)


def draft(proposer: Proposer, requests: list[Request], ks: list[int], free_k: int = 0) -> DraftRound:
    """Draft for several requests together (k = 0: no draft) and store each draft on its request.

    Starts a request's proposer on its first draft. Drafts for all of them in
    one batch where the proposer batches (one drafter forward per position).
    free_k: how long a draft that costs nothing (a matcher's, from a proposer
    with `propose_free`: a hybrid's) may run whatever its k. A
    planner's K prices a model's drafting rounds; cutting a hybrid's copied
    span to a K chosen for its model's would forgo free tokens (`Planner.trim`
    still decides how much of it is verified).
    """
    t0 = time.perf_counter()
    lengths = [min(k, r.draft_cap()) for r, k in zip(requests, ks)]
    for request in requests:
        request.draft = Draft([])
    live = [(r, k) for r, k in zip(requests, lengths) if k > 0]
    if not live:
        return DraftRound(0, 0, 0.0, True, 0, 0.0)
    started = [r for r, _ in live if not r.started]
    in_step = all(r in started or not r.catch_up() for r, _ in live)
    if started:
        forwards = proposer.forwards
        start_batch(proposer, [r.seq for r in started])  # one drafter prefill for all, where it batches
        for request in started:
            request.stats.draft_forwards += proposer.forwards - forwards
            request.started = True
    t1 = time.perf_counter()
    forwards = proposer.forwards
    free_ks = [min(free_k, r.draft_cap()) for r, _ in live] if free_k else None
    drafts = propose_batch(proposer, [r.seq for r, _ in live], [k for _, k in live], free_ks)
    forwards = proposer.forwards - forwards  # each served every sequence drafted here
    t2 = time.perf_counter()
    for (request, _), proposed in zip(live, drafts):
        request.draft = proposed
        request.proposer_seen = len(request.seq.tokens)
        request.stats.draft_s += (t2 - t0) / len(live)
        request.stats.draft_forwards += forwards
    longest = max(min(len(d), k) for d, (_, k) in zip(drafts, live))  # past k a draft was free
    started_tokens = sum(len(r.seq.tokens) - start_offset(proposer, len(r.seq.tokens)) for r in started)
    return DraftRound(len(live), longest, t2 - t1, in_step, started_tokens, t1 - t0, forwards)


def draft_free(proposer: Proposer, requests: list[Request], k: int) -> None:
    """The proposer's free drafts (`propose_free`: the part of it that runs no model, a hybrid's matcher)
    for requests the plan gave no draft, up to k tokens each; `Planner.trim` then decides whether any of
    a free draft is worth verifying. Nothing for a proposer without free drafts."""
    propose_free = getattr(proposer, "propose_free", None)
    if propose_free is None or k <= 0:
        return
    for request in requests:
        cap = min(k, request.draft_cap())
        if cap > 0 and not len(request.draft):
            t0 = time.perf_counter()
            request.draft = propose_free(request.seq, cap)
            request.stats.draft_s += time.perf_counter() - t0


def prefill_drafters(proposer: Proposer, requests: list[Request], counts: list[int]) -> DraftRound:
    """Feed each request's drafter a piece of what it has not seen (counts[i] tokens), starting it where new.

    A batching driver calls this instead of drafting for a request whose
    drafter is far behind (a new long prompt), a piece per step, so that the
    streams running beside it never wait for a whole drafter prefill (see
    `DraftModelProposer.prefill_batch`). The request drafts again once the
    rest fits in a step.
    """
    t0 = time.perf_counter()
    forwards = proposer.forwards
    seen = proposer.prefill_batch([r.seq for r in requests], counts)
    forwards = proposer.forwards - forwards
    seconds = time.perf_counter() - t0
    fed = 0
    for request, n in zip(requests, seen):
        fed += n - (request.proposer_seen if request.started else start_offset(proposer, len(request.seq.tokens)))
        request.started = True
        request.proposer_seen = n
        request.stats.draft_forwards += forwards
        request.stats.draft_s += seconds / len(requests)
    return DraftRound(0, 0, 0.0, True, fed, seconds)


@dataclass
class StepReport:
    """What one step did: a result per request (None where it failed or fed a prompt piece), and its timing."""

    results: list[VerifyResult | None]
    deltas: list[list[str]]
    failures: dict[int, Exception]  # request index -> what went wrong verifying or feeding it back
    width: int  # the longest decode block (every decode row's block is padded to it unless ragged)
    forward_s: float  # the target forward
    seconds: float  # forward, verification and the proposers' feedback
    rows: int = 0  # activation rows the forward computed (padding included)
    prompt_rows: int = 0  # of them, rows of prompts prefilled in pieces


def step(target: Model, requests: list[Request], cache: KVCache) -> StepReport:
    """One target forward over every request's block, then verify, commit, roll back and feed back.

    cache: row b holds requests[b]'s cached tokens (`cache_length()` of them).
    A request still prefilling its prompt in pieces (`Request.begin_prefill`)
    feeds its next piece in the same forward (the decoder's ragged rows: no
    decode block is padded to a piece's length); the piece that ends the
    prompt commits the first token, as `prefill` does. A failure while
    verifying one request is reported for that request alone; a failure of
    the forward itself raises.
    """
    t0 = time.perf_counter()
    decoder = target.decoder
    blocks = [r.block() for r in requests]
    decode_blocks = [b for r, b in zip(requests, blocks) if not r.prefilling]
    width = max((len(b) for b in decode_blocks), default=0)
    prompt_rows = sum(len(b) for r, b in zip(requests, blocks) if r.prefilling)
    hidden_layers: tuple[int, ...] = ()
    wants_hidden = False
    for r in requests:
        if r.started or r.prefilling:
            wanted, layers = _hidden_wanted(r.proposer)
            wants_hidden |= wanted
            hidden_layers = hidden_layers or layers
    states = hidden_layers if wants_hidden else None
    if decoder.ragged:
        ends = [r.prefilling and r.prompt_cached + len(b) == len(r.seq.tokens) for r, b in zip(requests, blocks)]
        logits_from = [len(b) - end if r.prefilling else 0 for r, b, end in zip(requests, blocks, ends)]
        per_seq, hidden = decoder.forward_rows(blocks, cache, logits_from, states=states)
        rows = sum(len(b) for b in blocks)
    else:
        if prompt_rows:
            raise ValueError("prompt pieces inside a step need the native layer (Decoder.ragged)")
        # Pad every block to the longest with its own last token: the padding rows
        # come after the real ones (causal: nobody real sees them) and are rolled
        # back below with the rejected drafts.
        padded = [b + [b[-1]] * (width - len(b)) for b in blocks]
        logits, states_ = decoder.forward_states(torch.tensor(padded, device=decoder.device), cache, states=states)
        per_seq = [logits[b, : len(block)] for b, block in enumerate(blocks)]
        hidden = list(states_.unbind(0)) if states_ is not None else None
        rows = width * len(blocks)
    forward_s = time.perf_counter() - t0
    results: list[VerifyResult | None] = []
    deltas: list[list[str]] = []
    failures: dict[int, Exception] = {}
    added: list[int] = []
    p_targets = _sampled_distributions(requests, per_seq)
    for b, request in enumerate(requests):
        before = len(request.seq.tokens)
        try:
            if request.prefilling:
                piece_states = hidden[b] if hidden is not None else None
                result, text = None, _prompt_piece(request, len(blocks[b]), per_seq[b], piece_states)
            else:
                result, text = _verify_and_commit(request, per_seq[b], p_targets.get(b))
        except Exception as exc:  # reported per request; the others go on
            failures[b] = exc
            result, text = None, []
        results.append(result)
        deltas.append(text)
        added.append(len(request.seq.tokens) - before)
    cache.truncate([r.cache_length() for r in requests])
    verified = time.perf_counter()
    for b, request in enumerate(requests):
        if results[b] is not None:
            request.stats.verify_s += verified - t0
        elif blocks[b]:
            request.stats.prefill_s += verified - t0
    for b, (request, result) in enumerate(zip(requests, results)):
        if result is None or not request.started:
            continue
        states_b = hidden[b][: added[b]] if hidden is not None and request.proposer.needs_hidden else None
        t1 = time.perf_counter()
        try:
            request.proposer.on_step(request.seq, result, states_b)
        except Exception as exc:
            failures[b] = exc
        request.stats.draft_s += time.perf_counter() - t1
    seconds = time.perf_counter() - t0
    return StepReport(results, deltas, failures, width, forward_s, seconds, rows, prompt_rows)


def _prompt_piece(request: Request, fed: int, logits: Tensor, states: Tensor | None) -> list[str]:
    """A piece of `fed` prompt tokens went through the forward: count it, keep its states ([fed, H']) for
    a proposer that reads the prompt's, and after the last piece commit the first token (logits [1, V])."""
    if not fed:
        return []
    request.stats.target_forwards += 1
    request.prompt_cached += fed
    if states is not None and needs_prompt_states(request.proposer):
        request.prompt_states.append(states)
    if request.prompt_cached < len(request.seq.tokens):
        return []
    request.prompt_cached = None
    prompt_hidden = torch.cat(request.prompt_states) if request.prompt_states else None
    request.prompt_states = []
    deltas = _first_token(request, logits[-1:])
    _start_eagerly(request, prompt_hidden)
    return deltas


def _sampled_distributions(requests: list[Request], per_seq: list[Tensor]) -> dict[int, Tensor]:
    """p_target [K + 1, V] of each sampled decoding request's rows, by its index: one `distribution` call for
    all the rows of requests with the same sampling controls (the same bits as a call per request: rows are
    independent). A request whose rows fail here is left out, to fail alone in `_verify_and_commit`."""
    groups: dict[tuple, list[tuple[int, Tensor]]] = {}
    for b, request in enumerate(requests):
        params = request.params
        if request.prefilling or params.greedy:
            continue
        try:
            shaped = shaped_logits(per_seq[b], params, request.seq.prompt, request.seq.output, request.draft.tokens)
        except Exception:  # noqa: BLE001 - reported for this request by _verify_and_commit
            continue
        groups.setdefault(params.distribution_controls, []).append((b, shaped))
    out: dict[int, Tensor] = {}
    for members in groups.values():
        try:
            probs = distribution(torch.cat([rows for _, rows in members]), requests[members[0][0]].params)
        except Exception:  # noqa: BLE001 - each request then computes its own and fails alone
            continue
        out.update(zip((b for b, _ in members), probs.split([rows.shape[0] for _, rows in members])))
    return out


def _verify_and_commit(request: Request, logits: Tensor, p_target: Tensor | None = None) -> tuple[VerifyResult, list[str]]:
    """Verify a request's draft against the target's logits [K + 1, V] and commit the result; p_target, the
    rows' distribution where the step computed it with other requests' (`_sampled_distributions`)."""
    draft_, seq, params = request.draft, request.seq, request.params
    if params.greedy:  # the target's choices alone: no one-hot rows to build and read back
        chosen = greedy_tokens(logits, params, seq.prompt, seq.output, draft_.tokens).tolist()
        result = verify_greedy(draft_.tokens, chosen)
    else:
        if p_target is None:
            p_target = probabilities(logits, params, seq.prompt, seq.output, draft_.tokens)
        if params.coupled:
            result = verify_coupled(draft_.tokens, p_target, params.seed, len(seq.output))
        else:
            result = verify_chain(draft_.tokens, draft_.q_draft, p_target, greedy=False, generator=seq.generator)
    request.stats.record_step(len(draft_.tokens), result.num_accepted)
    request.draft = Draft([])
    return result, request.commit(result.tokens, logits)
