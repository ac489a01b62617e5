"""augury bench with one more contender: "hybrid-noguess", the default hybrid whose 0.5B does not check its
matcher's guesses (the code before this session), interleaved in one process with the new default."""
import sys

from augury.commands import bench as b

orig = b._build_local


def patched(args, methods, ks, options):
    target, contenders, draft_model = orig(args, methods, ks, options)
    from augury.bench.runner import EngineContender
    from augury.proposers import build_proposer

    proposer = build_proposer("hybrid", target, dict(options.get("hybrid") or {}))
    proposer.model.checks_guesses = False
    contenders.append(EngineContender(target, proposer, "hybrid-noguess", ks[0], adaptive=not args.fixed_k))
    return target, contenders, draft_model


b._build_local = patched
from augury.cli import main

sys.exit(main())
