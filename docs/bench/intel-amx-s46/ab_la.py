"""augury bench with two more contenders: "hybrid-la16" (CATCH_UP_LOOKAHEAD 16 instead of 8) and "hybrid-old"
(the rules of 279dc01, old_rule.py), interleaved with the others in one process. A benchmark aid."""
import sys

sys.path.insert(0, "/work/benchrun/s46")
from old_rule import make_old

from augury.commands import bench as b

orig = b._build_local


def patched(args, methods, ks, options):
    target, contenders, draft_model = orig(args, methods, ks, options)
    from augury.bench.runner import EngineContender
    from augury.proposers import build_proposer

    la16 = EngineContender(target, build_proposer("hybrid", target, options.get("hybrid")), "hybrid-la16", ks[0],
                           adaptive=not args.fixed_k)
    la16.engine.planner.CATCH_UP_LOOKAHEAD = 16
    old = EngineContender(target, build_proposer("hybrid", target, options.get("hybrid")), "hybrid-old", ks[0],
                          adaptive=not args.fixed_k)
    make_old(old.engine.planner)
    contenders.extend([la16, old])
    return target, contenders, draft_model


b._build_local = patched
from augury.cli import main

sys.exit(main())
