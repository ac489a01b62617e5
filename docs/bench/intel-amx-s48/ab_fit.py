"""augury bench with two more contenders: "hybrid-q40" (the 0.5B's wider blocks re-quantized to Q4_0 by round to
nearest at load) and "hybrid-q40fit" (the same with each block's scale fitted, augury.kernels.requantize.fitted),
interleaved in one process with the default hybrid. A benchmark aid; run with PYTHONPATH at the q40 worktree."""
import sys
import time

import torch

from augury.commands import bench as b
from augury.kernels import reference, requantize
from augury.kernels.weight import GgufWeight

orig = b._build_local


def requantized_by(quantizer):
    def requantized(self, kind):
        dense = torch.cat([reference.affine_dequantize(d) for d in self.decoded()])
        return GgufWeight([(kind, quantizer(dense))], dtype=self.dtype, kernel=self.kernel or False)
    return requantized


def patched(args, methods, ks, options):
    target, contenders, draft_model = orig(args, methods, ks, options)
    from augury.bench.runner import EngineContender
    from augury.proposers import build_proposer

    given = dict(options.get("hybrid") or {})
    given["draft_quant"] = "q4_0"
    for name, quantizer in (("hybrid-q40", requantize.round_to_nearest), ("hybrid-q40fit", requantize.fitted)):
        GgufWeight.requantized = requantized_by(quantizer)
        t0 = time.time()
        contender = EngineContender(target, build_proposer("hybrid", target, given), name, ks[0],
                                    adaptive=not args.fixed_k)
        print(f"{name}: built in {time.time() - t0:.1f} s", file=sys.stderr)
        contenders.append(contender)
    return target, contenders, draft_model


b._build_local = patched
from augury.cli import main

sys.exit(main())
