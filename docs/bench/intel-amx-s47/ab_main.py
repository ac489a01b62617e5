"""augury bench with one more contender: "hybrid-main", the default hybrid with main's (0335315) planner rules: every
catch-up capped at the tokens generated plus 8, K = 0 priced as plain decoding, no re-measuring of an idle drafter;
interleaved in one process with the working tree's default. A benchmark aid."""
import sys
import types

from augury.commands import bench as b

orig = b._build_local


def capped(self, request):
    return min(self._tokens_left(request), len(request.seq.output) + self.CATCH_UP_LOOKAHEAD)


def patched(args, methods, ks, options):
    target, contenders, draft_model = orig(args, methods, ks, options)
    from augury.bench.runner import EngineContender
    from augury.proposers import build_proposer

    old = EngineContender(target, build_proposer("hybrid", target, options.get("hybrid")), "hybrid-main", ks[0],
                          adaptive=not args.fixed_k)
    planner = old.engine.planner
    planner._catch_up_spread = types.MethodType(capped, planner)
    planner._free_tokens = lambda request: 0.0
    planner._remeasure = lambda request: False
    contenders.append(old)
    return target, contenders, draft_model


b._build_local = patched
from augury.cli import main

sys.exit(main())
