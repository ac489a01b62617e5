"""What one step's plan is expected to deliver: tokens per second by draft length (`plan_step`) and the
price of the target's verifying forward (`verify_time`), from measured costs and acceptance. Pure functions of
their arguments; `Planner` holds the measurements and calls them (split from planner.py: docs/design.md).

    rate(K) = sum_r E_r(k_r) / (t_target(n, 1 + max_r k_r) + t_draft(K) + catch-ups)
    E_r(k)  = 1 + sum_{i<k} reach[i] * accept_r[i]   (accepted prefix + the target's token)
    k_r     = min(K, tokens request r may still draft)

- t_target(rows, T) (`StepCosts`): seconds of one step with `rows` sequences
  and blocks of T tokens: the median of its last samples once that shape was
  seen a few times, before that a least-squares line over all shapes. With too
  little data the line is flat (verification looks free), so the planner
  drafts and learns.
- t_draft(K): drafting rounds times the measured seconds of one round; a
  batching drafter serves all drafting sequences in one forward per round.
- reach[i], accept[i] (`DraftOdds`, from `DraftTally`): measured per drafted
  position, since acceptance is strongly correlated along a draft.
- catch-up: a drafter L tokens behind first feeds them (priced as one
  drafter forward plus a measured per-token rate); that one-off cost is
  spread over the tokens the planner says a request has left.
- at K = 0 a sequence commits one token plus what its free drafts (a hybrid's
  matcher) commit, where the planner counts them.
"""

from __future__ import annotations

from collections.abc import Sequence

from augury.draft_odds import DraftOdds
from augury.step_costs import StepCosts


def plan_step(
    costs: StepCosts,
    odds: list[DraftOdds],
    caps: list[int],
    fixed: list[int | None],
    k_max: int,
    *,
    batched: bool = False,
    behind: list[int] | None = None,
    left: list[float] | None = None,
    margin: float = 0.0,
    choices: Sequence[int] | None = None,
    drafted: bool = False,
    free: list[float] | None = None,
) -> list[int]:
    """Per-sequence draft lengths for one step: the common K that maximizes expected tokens per second.

    odds: what drafting delivers for each sequence; caps: most tokens each may
    draft now; fixed: a draft length a sequence must use (seeded sampling) or
    None. batched: the drafter serves all drafting sequences in one forward per
    round (rounds = the longest draft), rather than one sequence at a time.
    behind: tokens each sequence's drafter must first catch up on (all of them
    if it never drafted). That one-off cost buys drafting for the rest of the
    request, so it is spread over the steps the request has left (left[r]
    tokens, default caps[r] + 1, at E_r(k) a step).
    margin: how much faster than plain decoding (K = 0) drafting must be
    predicted to be before it is chosen (0.1 = 10%).
    choices: the common Ks to consider (default 0..k_max).
    drafted: the drafts are already made (their cost is spent), so only the
    target's forward is priced: how much of each draft to verify (`Planner.trim`).
    free: tokens beyond one that each sequence commits at K = 0 from drafts that cost nothing (a
    hybrid's matcher, `Planner._free_tokens`): what a model's drafts must beat is that, not plain decoding.
    """
    rows = len(odds)
    free = free or [0.0] * rows
    behind = behind or [0] * rows
    left = left or [cap + 1 for cap in caps]
    catch_up_s = [costs.catch_up_time(late) for late in behind]  # per sequence, whatever K
    best, best_rate = [0] * rows, -1.0
    for k in range(k_max + 1) if choices is None else sorted(choices):
        ks = [min(f if f is not None else k, cap) for f, cap in zip(fixed, caps)]
        tokens = sum(o.tokens(kr) if kr else 1.0 + f for o, kr, f in zip(odds, ks, free))
        drafting = [(o, kr) for o, kr in zip(odds, ks) if kr > 0]
        if not drafting or drafted:
            draft_s = 0.0
        elif batched and len(drafting) > 1:
            draft_s = max(kr for _, kr in drafting) * costs.draft_round_time(len(drafting))
        else:
            draft_s = sum(o.drafted(kr) for o, kr in drafting) * costs.draft_round_time(1)
        for o, kr, late_s, tokens_left in zip(odds, ks, catch_up_s, left):
            if kr > 0 and late_s:
                steps_left = max(1.0, tokens_left / o.tokens(kr))
                draft_s += late_s / steps_left
        seconds = verify_time(costs, odds, ks, drafted=drafted) + draft_s
        rate = tokens / max(seconds, 1e-9)
        # Drafting must beat plain decoding by a margin, not a hair: the
        # estimates are noisy, and a wrong "draft" costs speed while a wrong
        # "don't" only forgoes it.
        needed = best_rate * (1 + margin) if k > 0 and not any(best) else best_rate * (1 + 1e-9)
        if rate > needed:
            best, best_rate = ks, rate
    return best


def verify_time(costs: StepCosts, odds: list[DraftOdds], ks: list[int], *, drafted: bool = False) -> float:
    """Seconds of the target's forward that verifies drafts of up to ks[r] tokens.

    A batch's forward is as wide as its longest draft allows. A sequence alone
    verifies what its drafter drafted, which for one that stops when it doubts
    is often less than it was allowed: its forward's expected cost over the
    drafted length d (reach[i] = P(d > i)),
        t(1) + sum_{i<k} reach[i] * (t(i + 2) - t(i + 1)).
    Priced at the full width instead, a long allowance looked as dear as a
    long draft, and where verification is steep (a CPU with one integer
    multiply pipe, docs/benchmarks.md 28) that hid the short drafts that pay.
    """
    if len(ks) > 1 or drafted or ks[0] == 0:  # made drafts (trim) are verified at their own length
        return costs.target_time(len(ks), 1 + max(ks))
    seconds = previous = costs.target_time(1, 1)
    for i, reach in enumerate(odds[0].reach[: ks[0]]):
        wider = costs.target_time(1, i + 2)
        seconds += reach * (wider - previous)
        previous = wider
    return seconds
