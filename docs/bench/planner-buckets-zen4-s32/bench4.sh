#!/bin/sh
# s32: a drafter's catch-up spread over how long outputs run (OutputLengths); greedy plain, suffix, hybrid, model
cd /work/main
S=/work/benchrun/s32
date
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,suffix,hybrid,model --out $S/greedy-lengths > $S/greedy-lengths.log 2>&1
date
