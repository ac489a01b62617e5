"""augury bench (branch cheap-start) with two more contenders: "hybrid-cap" (7575ac7's rule: the cap on every
catch-up, however cheap) and "hybrid-old" (279dc01's rules), interleaved in one process. A benchmark aid."""
import sys
import types

sys.path.insert(0, "/work/benchrun/s46")
from old_rule import make_old

from augury.commands import bench as b

orig = b._build_local


def capped(self, request):
    return min(self._tokens_left(request), len(request.seq.output) + self.CATCH_UP_LOOKAHEAD)


def patched(args, methods, ks, options):
    target, contenders, draft_model = orig(args, methods, ks, options)
    from augury.bench.runner import EngineContender
    from augury.proposers import build_proposer

    cap = EngineContender(target, build_proposer("hybrid", target, options.get("hybrid")), "hybrid-cap", ks[0],
                          adaptive=not args.fixed_k)
    cap.engine.planner._catch_up_spread = types.MethodType(capped, cap.engine.planner)
    old = EngineContender(target, build_proposer("hybrid", target, options.get("hybrid")), "hybrid-old", ks[0],
                          adaptive=not args.fixed_k)
    make_old(old.engine.planner)
    contenders.extend([cap, old])
    return target, contenders, draft_model


b._build_local = patched
from augury.cli import main

sys.exit(main())
