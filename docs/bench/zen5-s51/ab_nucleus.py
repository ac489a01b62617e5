"""augury bench with one more contender: "hybrid-sortq", the default hybrid whose drafter cuts its top-p
nucleus by sorting its whole 32k-id row (the code before this session: no stage ran on rows of at most
65,536 ids), interleaved in one process with the new default (the top-k stages on the drafter's row too)."""
import sys

import augury.sampling as sampling
from augury.commands import bench as b

orig = b._build_local
new_stages = sampling.nucleus_stages


def old_stages(vocab):
    return () if vocab <= 2 * sampling.NUCLEUS_CANDIDATES[-1] else new_stages(vocab)


def patched(args, methods, ks, options):
    target, contenders, draft_model = orig(args, methods, ks, options)
    from augury.bench.runner import EngineContender
    from augury.proposers import build_proposer

    proposer = build_proposer("hybrid", target, dict(options.get("hybrid") or {}))
    arm = EngineContender(target, proposer, "hybrid-sortq", ks[0], adaptive=not args.fixed_k)
    inner = arm.generate

    def generate(*a, **kw):
        sampling.nucleus_stages = old_stages
        try:
            return inner(*a, **kw)
        finally:
            sampling.nucleus_stages = new_stages

    arm.generate = generate
    contenders.append(arm)
    return target, contenders, draft_model


b._build_local = patched
from augury.cli import main

sys.exit(main())
