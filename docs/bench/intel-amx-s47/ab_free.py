"""augury bench with one more contender: "hybrid-nofree", the default hybrid whose planner prices K = 0 as plain
decoding (main before the free-tokens change: Planner._free_tokens returns 0), interleaved in one process with
the default. A benchmark aid."""
import sys

from augury.commands import bench as b

orig = b._build_local


def patched(args, methods, ks, options):
    target, contenders, draft_model = orig(args, methods, ks, options)
    from augury.bench.runner import EngineContender
    from augury.proposers import build_proposer

    old = EngineContender(target, build_proposer("hybrid", target, options.get("hybrid")), "hybrid-nofree", ks[0],
                          adaptive=not args.fixed_k)
    old.engine.planner._free_tokens = lambda request: 0.0
    contenders.append(old)
    return target, contenders, draft_model


b._build_local = patched
from augury.cli import main

sys.exit(main())
