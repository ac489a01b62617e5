"""augury bench with one more contender: "hybrid-gguf", the hybrid whose 0.5B keeps its own GGUF blocks
(--draft-quant gguf, the default before q40-drafter), interleaved in one process with the new default
(fitted Q4_0). A benchmark aid; run with PYTHONPATH at the q40 worktree."""
import sys

from augury.commands import bench as b

orig = b._build_local


def patched(args, methods, ks, options):
    target, contenders, draft_model = orig(args, methods, ks, options)
    from augury.bench.runner import EngineContender
    from augury.proposers import build_proposer

    given = dict(options.get("hybrid") or {})
    given["draft_quant"] = "gguf"
    contenders.append(EngineContender(target, build_proposer("hybrid", target, given), "hybrid-gguf", ks[0],
                                      adaptive=not args.fixed_k))
    return target, contenders, draft_model


b._build_local = patched
from augury.cli import main

sys.exit(main())
