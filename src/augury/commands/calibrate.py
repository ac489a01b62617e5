"""`augury calibrate`: choose the layers a layer-skip drafter leaves out, for one model on this machine.

Greedy search: start from skipping nothing and repeatedly add the layer whose
removal gives the fastest speculative greedy decoding, keeping the first and
last layers, until no addition is faster. Speed is tokens per second of
greedy speculative decoding, computed from two measured parts:

- how many drafted tokens the target accepts: the skipped model is run once,
  teacher-forced, over each prompt plus the target's own greedy output. In
  greedy speculative decoding a drafted token is always proposed after the
  target's own prefix (every earlier one was accepted, or the step ended), so
  replaying the chain over this match array gives exactly the accepted counts
  and the number of target forwards that decoding would take;
- what a step costs: a drafter forward (fixed part plus a per-layer part) and
  a verification forward of the target, each timed on this machine.

Timing every candidate by actually decoding would be several times slower and,
on a busy machine, noisy enough to pick the wrong layer; the final set is
decoded for real at the end and both speeds are printed.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from augury.cache import slots_for
from augury.commands.common import add_model_args
from augury.engine import Engine, check_k
from augury.errors import AuguryError
from augury.metrics import SpecStats
from augury.models.decoder import Decoder
from augury.models.loader import Model
from augury.proposers.layer_skip import LayerSkipProposer
from augury.proposers.skipped_layers import calibration_path, layer_skip_model, skip_layers
from augury.sampling import SamplingParams

CALIBRATION_PROMPTS = (
    "Write a Python function that checks whether a string is a palindrome.",
    "Explain in three sentences how a hash table handles collisions.",
    "Summarize the plot of Romeo and Juliet in a short paragraph.",
    "Write a SQL query that returns the ten customers with the highest total order value.",
    "List five tips for writing clear commit messages.",
    "Solve step by step: a train travels 120 km in 1.5 hours; what is its average speed?",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "calibrate",
        help="choose which layers --draft-method layerskip skips",
        description="Search the layers to skip for layer-skip self-speculation and save them as JSON "
        "(default $AUGURY_HOME/calibration/<model>-layerskip.json, which layerskip then uses by default). "
        "Fast by default: 2 short prompts, 32 tokens each, odd layers only, and after a first round that "
        "tries each candidate layer alone, only the best few remaining candidates per round; expect a few "
        "minutes for a 1.5B model on a laptop CPU. Raise --prompts, --max-tokens, --candidates or use "
        "--pool all for a more thorough search.",
    )
    add_model_args(p)
    p.add_argument("--prompts", type=int, default=2, help=f"built-in prompts to use, 1-{len(CALIBRATION_PROMPTS)} "
                   "(default 2)")
    p.add_argument("--max-tokens", "-n", type=int, default=32, help="tokens generated per prompt (default 32)")
    p.add_argument("--k", type=int, default=4, help="draft length the speed is computed for (default 4)")
    p.add_argument("--candidates", type=int, default=3,
                   help="layers tried per round after the first round (default 3)")
    p.add_argument("--pool", choices=("odd", "all"), default="odd",
                   help="candidate layers: odd-numbered ones (default) or all but the first and last")
    p.add_argument("--out", default=None, help="where to save the JSON (default under $AUGURY_HOME/calibration)")
    p.set_defaults(func=run_calibrate)


@dataclass
class StepCosts:
    """Seconds per forward on this machine: drafter = fixed + per_layer * kept layers."""

    plain: float  # the target decoding one token
    draft_fixed: float
    draft_per_layer: float
    verify: float  # the target scoring last + K drafted tokens

    def draft(self, kept_layers: int) -> float:
        return self.draft_fixed + self.draft_per_layer * kept_layers


@dataclass
class Trial:
    skip: list[int]
    alpha: float
    tau: float
    tokens_per_s: float  # modeled from the acceptance replay and StepCosts


def _forward_timer(decoder: Decoder, context: list[int], rows: int) -> Callable[[], float]:
    """A function timing one forward of `rows` new tokens after `context` (the cache is rolled back after each)."""
    cache = decoder.new_cache(1, slots_for(len(context), rows))
    decoder.forward(torch.tensor([context], device=decoder.device), cache)
    block = torch.tensor([(context * rows)[-rows:]], device=decoder.device)

    def run() -> float:
        t0 = time.perf_counter()
        decoder.forward(block, cache)
        elapsed = time.perf_counter() - t0
        cache.truncate(len(context))
        return elapsed

    return run


def measure_costs(target: Model, context: list[int], k: int, rounds: int = 5) -> StepCosts:
    """Time a plain decode step, one-token drafter steps with all layers and with none, and a verification.

    The four are interleaved and each keeps its fastest round, so that load
    from other processes does not fall on one of them only.
    """
    layers = target.config.num_layers
    timers = {
        "plain": _forward_timer(target.decoder, context, 1),
        "full": _forward_timer(skip_layers(target.decoder, []), context, 1),
        "fixed": _forward_timer(skip_layers(target.decoder, range(layers)), context, 1),
        "verify": _forward_timer(target.decoder, context, k + 1),
    }
    best = {name: float("inf") for name in timers}
    for i in range(rounds + 1):  # the first round warms up
        for name, timer in timers.items():
            elapsed = timer()
            if i:
                best[name] = min(best[name], elapsed)
    per_layer = max(best["full"] - best["fixed"], 0.0) / layers
    return StepCosts(plain=best["plain"], draft_fixed=best["fixed"], draft_per_layer=per_layer, verify=best["verify"])


def replay(matches: list[bool], k: int) -> tuple[int, int, int]:
    """Greedy speculative decoding over a teacher-forced match array: (steps, drafted, accepted).

    matches[j]: the drafter's argmax after the target's first j output tokens
    equals output token j. Token 0 comes from the prefill; each step then
    accepts the run of matches (up to k) and adds the target's own token.
    """
    steps = drafted = accepted = 0
    done = 1
    while done < len(matches):
        k_step = min(k, len(matches) - done - 1)
        run = 0
        while run < k_step and matches[done + run]:
            run += 1
        steps += 1
        drafted += k_step
        accepted += run
        done += run + 1
    return steps, drafted, accepted


def teacher_forced_matches(decoder: Decoder, prompt: list[int], output: list[int]) -> list[bool]:
    """Whether `decoder` predicts each output token from the true prefix (one forward over the whole text)."""
    tokens = prompt + output[:-1]
    cache = decoder.new_cache(1, slots_for(len(tokens)))
    rows = torch.arange(len(prompt) - 1, len(tokens), device=decoder.device)
    logits = decoder.forward(torch.tensor([tokens], device=decoder.device), cache, logits_rows=rows)
    return (logits[0].argmax(-1).cpu() == torch.tensor(output)).tolist()


def calibrate(
    target: Model,
    prompts: list[list[int]],
    *,
    max_tokens: int = 32,
    k: int = 4,
    candidates: int = 3,
    pool: str = "odd",
    log: Callable[[str], None] = print,
) -> dict:
    """Search a skip set for `target` on these prompts; returns what a calibration file records."""
    check_k(k)
    layers = target.config.num_layers
    if layers < 3:
        raise AuguryError(f"layer skipping needs a model with at least 3 layers, this one has {layers}")
    if candidates < 1:
        raise AuguryError(f"--candidates must be at least 1, got {candidates}")
    params = SamplingParams(max_tokens=max_tokens)
    plain = [Engine(target).generate(ids, params) for ids in prompts]
    outputs = [r.token_ids for r in plain]
    costs = measure_costs(target, prompts[0], k)
    log(f"step costs: plain {costs.plain * 1e3:.1f} ms, drafter {costs.draft_fixed * 1e3:.1f} ms + "
        f"{costs.draft_per_layer * 1e3:.2f} ms/layer, verification of {k + 1} tokens {costs.verify * 1e3:.1f} ms")

    def trial(skip: list[int], quiet: bool = False) -> Trial:
        decoder = skip_layers(target.decoder, skip)
        steps = drafted = accepted = 0
        for ids, output in zip(prompts, outputs):
            if len(output) < 2:
                continue
            matches = teacher_forced_matches(decoder, ids, output) if skip else [True] * len(output)
            s, d, a = replay(matches, k)
            steps, drafted, accepted = steps + s, drafted + d, accepted + a
        committed = steps + accepted
        step_s = k * costs.draft(layers - len(skip)) + costs.verify
        result = Trial(sorted(skip), accepted / max(drafted, 1), committed / max(steps, 1),
                       committed / max(steps * step_s, 1e-12))
        if not quiet:
            log(f"  skip {result.skip}: alpha {result.alpha:.2f} tau {result.tau:.2f} "
                f"-> {result.tokens_per_s:.2f} tok/s (modeled)")
        return result

    best = trial([], quiet=True)  # nothing skipped: every draft is accepted, at full cost
    remaining = [i for i in range(1, layers - 1) if pool == "all" or i % 2 == 1]
    history: list[Trial] = []
    ranking: list[int] | None = None
    round_no = 0
    while remaining:
        round_no += 1
        tried = remaining if ranking is None else [i for i in ranking if i in remaining][:candidates]
        log(f"round {round_no}: adding one of {tried} to {best.skip}")
        trials = {i: trial(best.skip + [i]) for i in tried}
        history += trials.values()
        if ranking is None:  # later rounds try the layers that hurt least on their own first
            ranking = sorted(tried, key=lambda i: -trials[i].tokens_per_s)
        layer, cand = max(trials.items(), key=lambda item: item[1].tokens_per_s)
        if cand.tokens_per_s <= best.tokens_per_s:
            break
        best = cand
        remaining.remove(layer)
    plain_modeled = 1.0 / costs.plain
    log(f"best: skip {best.skip} (alpha {best.alpha:.2f}, tau {best.tau:.2f}): {best.tokens_per_s:.2f} tok/s "
        f"modeled vs {plain_modeled:.2f} tok/s plain")
    if best.tokens_per_s <= plain_modeled:
        log("note: on these costs layer skipping is not expected to beat plain decoding")
    plain_stats = SpecStats()
    for r in plain:
        plain_stats = plain_stats.merge(r.stats)
    measured = {"plain_tokens_per_s": plain_stats.tokens_per_s}
    if best.skip:
        proposer = LayerSkipProposer(layer_skip_model(target, best.skip), target.config.vocab_size)
        runs = [Engine(target, proposer, k=k).generate(ids, params) for ids in prompts]
        spec_stats = SpecStats()
        for r in runs:
            spec_stats = spec_stats.merge(r.stats)
        same = all(r.token_ids == o for r, o in zip(runs, outputs))
        measured.update(speculative_tokens_per_s=spec_stats.tokens_per_s, tau=spec_stats.tau,
                        alpha=spec_stats.alpha, identical_to_plain=same)
        log(f"measured decoding: layerskip {spec_stats.tokens_per_s:.2f} tok/s vs plain "
            f"{plain_stats.tokens_per_s:.2f} tok/s (tau {spec_stats.tau:.2f}, alpha {spec_stats.alpha:.2f}, "
            f"output identical to plain: {'yes' if same else 'NO'})")
    return {
        "skip_layers": best.skip,
        "k": k,
        "modeled_tokens_per_s": best.tokens_per_s,
        "alpha": best.alpha,
        "tau": best.tau,
        "measured": measured,
        "costs": asdict(costs),
        "trials": [asdict(t) for t in history],
        "prompts": len(prompts),
        "max_tokens": max_tokens,
    }


def run_calibrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from augury.files import check_writable
    from augury.models.loader import load_model
    from augury.models.tokenizer import build_prompt_ids
    from augury.proposers.skipped_layers import write_calibration

    if not 1 <= args.prompts <= len(CALIBRATION_PROMPTS):
        raise AuguryError(f"--prompts must be between 1 and {len(CALIBRATION_PROMPTS)}, got {args.prompts}")
    if args.max_tokens < 2:
        raise AuguryError(f"--max-tokens must be at least 2, got {args.max_tokens}")
    if args.out:
        check_writable(Path(args.out), "--out")
    target = load_model(args.model, dtype=args.dtype, device=args.device, offline=args.offline, exact=args.exact)
    chat = bool(target.tokenizer.meta.chat_template)
    prompts = [build_prompt_ids(target.tokenizer, text, chat) for text in CALIBRATION_PROMPTS[: args.prompts]]
    result = calibrate(target, prompts, max_tokens=args.max_tokens, k=args.k, candidates=args.candidates,
                       pool=args.pool)
    if not result["skip_layers"]:
        print("no layer could be skipped profitably; nothing saved")
        return 1
    out = Path(args.out) if args.out else calibration_path(args.model)
    skip = result.pop("skip_layers")
    write_calibration(out, args.model, target.config.num_layers, skip, dtype=args.dtype, **result)
    print(f"saved skip layers {skip} to {out}")
    return 0
