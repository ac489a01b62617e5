"""augury bench with one more contender: "hybrid-q40", the default hybrid whose 0.5B drafter's wider blocks are
re-quantized to Q4_0 at load (--draft-quant q4_0), interleaved in one process with the default. A benchmark aid."""
import dataclasses
import sys

from augury.commands import bench as b

orig = b._build_local


def patched(args, methods, ks, options):
    target, contenders, draft_model = orig(args, methods, ks, options)
    from augury.bench.runner import EngineContender
    from augury.proposers import build_proposer
    from augury.proposers.options import HybridOptions

    given = dict(options.get("hybrid") or {})
    given["draft_quant"] = "q4_0"
    q40 = EngineContender(target, build_proposer("hybrid", target, given), "hybrid-q40", ks[0],
                          adaptive=not args.fixed_k)
    contenders.append(q40)
    return target, contenders, draft_model


b._build_local = patched
from augury.cli import main

sys.exit(main())
