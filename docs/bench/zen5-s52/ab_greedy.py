"""augury bench with an old twin of every contender: "<method>-onehot" verifies and commits greedy rows
through `probabilities`' one-hot rows (the code before this session: zeroed rows, then argmax read back by
verify_chain), interleaved in one process with the same method on the new code (argmax alone)."""
import sys

import augury.step as step_module
from augury.commands import bench as b
from augury.sampling import draw, probabilities
from augury.proposers.base import Draft
from augury.verify import verify_chain, verify_coupled

orig = b._build_local
new_verify, new_first = step_module._verify_and_commit, step_module._first_token


def old_verify(request, logits):
    draft_, seq = request.draft, request.seq
    p_target = probabilities(logits, request.params, seq.prompt, seq.output, draft_.tokens)
    if request.params.coupled:
        result = verify_coupled(draft_.tokens, p_target, request.params.seed, len(seq.output))
    else:
        result = verify_chain(draft_.tokens, draft_.q_draft, p_target, greedy=request.params.greedy,
                              generator=seq.generator)
    request.stats.record_step(len(draft_.tokens), result.num_accepted)
    request.draft = Draft([])
    return result, request.commit(result.tokens, logits)


def old_first(request, last):
    seq = request.seq
    probs = probabilities(last, request.params, seq.prompt, seq.output)
    return request.commit([draw(probs[0], seq, position=0)], last)


def patched(args, methods, ks, options):
    target, contenders, draft_model = orig(args, methods, ks, options)
    from augury.bench.runner import EngineContender
    from augury.proposers import build_proposer

    twins = []
    for c in contenders:  # each twin with a drafter of its own (a hybrid's matcher keeps earlier outputs)
        method = c.method.partition("@")[0]
        proposer = None if c.engine.proposer is None else build_proposer(method, target, options.get(method))
        arm = EngineContender(target, proposer, c.method + "-onehot", c.k, adaptive=c.engine.planner is not None)
        inner = arm.generate

        def generate(*a, _inner=inner, **kw):
            step_module._verify_and_commit, step_module._first_token = old_verify, old_first
            try:
                return _inner(*a, **kw)
            finally:
                step_module._verify_and_commit, step_module._first_token = new_verify, new_first

        arm.generate = generate
        twins.append(arm)
    contenders.extend(twins)
    return target, contenders, draft_model


if __name__ == "__main__":
    b._build_local = patched
    from augury.cli import main

    sys.exit(main())
