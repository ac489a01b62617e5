"""augury bench with one more contender: "hybrid-oldprior", the default hybrid whose planner reads the saved
cost curve as measured (each point MIN_SAMPLES samples, the code before this session), interleaved in one
process with the new default (the curve a prior scaled by what the run measures)."""
import sys

from augury.commands import bench as b
from augury.step_costs import ShapeCosts

orig = b._build_local


def patched(args, methods, ks, options):
    target, contenders, draft_model = orig(args, methods, ks, options)
    from augury.bench.runner import EngineContender
    from augury.proposers import build_proposer

    proposer = build_proposer("hybrid", target, dict(options.get("hybrid") or {}))
    arm = EngineContender(target, proposer, "hybrid-oldprior", ks[0], adaptive=not args.fixed_k)
    costs = arm.engine.planner.costs.target
    for shape, seconds in costs.prior.items():  # the old reading: the saved points as this run's samples
        for _ in range(ShapeCosts.MIN_SAMPLES):
            costs.recent.setdefault(shape, __import__("collections").deque(maxlen=costs.RECENT)).append(seconds)
    costs.prior.clear()
    print("hybrid-oldprior starts from", {s: round(t * 1e3, 1) for s, t in
                                           ((s, costs.time(s, 0)) for s in sorted(costs.recent))}, file=sys.stderr)
    contenders.append(arm)
    return target, contenders, draft_model


b._build_local = patched
from augury.cli import main

sys.exit(main())
