"""augury bench with one more contender: "hybrid-prev", the default hybrid with the planner rule before the shadow
(a running model weighed against plain decoding, its matcher's free tokens only before a dear catch-up),
interleaved in one process with the working tree's default. A benchmark aid; PYTHONPATH at the q40 worktree."""
import sys

from augury.commands import bench as b

orig = b._build_local


def patched(args, methods, ks, options):
    target, contenders, draft_model = orig(args, methods, ks, options)
    from augury.bench.runner import EngineContender
    from augury.proposers import build_proposer

    prev = EngineContender(target, build_proposer("hybrid", target, options.get("hybrid")), "hybrid-prev", ks[0],
                           adaptive=not args.fixed_k)
    prev.engine.planner._weighs_free = lambda request, dear: dear
    contenders.append(prev)
    return target, contenders, draft_model


b._build_local = patched
from augury.cli import main

sys.exit(main())
