"""augury bench with one more contender, "hybrid-old": the default hybrid whose planner spreads a drafter's
catch-up over the whole expected output (CATCH_UP_LOOKAHEAD unbounded: the rule before s46), interleaved
with the others in the same process. A benchmark aid, not a product option."""
import sys

sys.path.insert(0, "/work/benchrun/s46")
from old_rule import make_old

from augury.commands import bench as b

orig = b._build_local


def patched(args, methods, ks, options):
    target, contenders, draft_model = orig(args, methods, ks, options)
    from augury.bench.runner import EngineContender
    from augury.proposers import build_proposer

    proposer = build_proposer("hybrid", target, options.get("hybrid"))
    old = EngineContender(target, proposer, "hybrid-old", ks[0], adaptive=not args.fixed_k)
    make_old(old.engine.planner)
    contenders.append(old)
    return target, contenders, draft_model


b._build_local = patched
from augury.cli import main

sys.exit(main())
