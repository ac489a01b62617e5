"""augury bench with two more contenders, "plain-oop" and "hybrid-oop": plain decoding and the default hybrid
whose sampling distributions come from `probabilities` as of 4e0b821 (every step out of place, a fresh
[N, V] tensor each: sampling_before_inplace.py), interleaved in one process with the new code's arms."""
import importlib.util
import sys

import augury.proposers.draft_model as draft_model
import augury.step as step
from augury.commands import bench as b

spec = importlib.util.spec_from_file_location("old_sampling", "/work/benchrun/s51/sampling_before_inplace.py")
old = importlib.util.module_from_spec(spec)
sys.modules["old_sampling"] = old
spec.loader.exec_module(old)
new_probabilities = step.probabilities
orig = b._build_local


def with_old(arm):
    inner = arm.generate

    def generate(*a, **kw):
        step.probabilities = draft_model.probabilities = old.probabilities
        try:
            return inner(*a, **kw)
        finally:
            step.probabilities = draft_model.probabilities = new_probabilities

    arm.generate = generate
    return arm


def patched(args, methods, ks, options):
    target, contenders, draft_model_ = orig(args, methods, ks, options)
    from augury.bench.runner import EngineContender
    from augury.proposers import build_proposer

    contenders.append(with_old(EngineContender(target, None, "plain-oop", 0)))
    proposer = build_proposer("hybrid", target, dict(options.get("hybrid") or {}))
    contenders.append(with_old(EngineContender(target, proposer, "hybrid-oop", ks[0], adaptive=not args.fixed_k)))
    return target, contenders, draft_model_


b._build_local = patched
from augury.cli import main

sys.exit(main())
