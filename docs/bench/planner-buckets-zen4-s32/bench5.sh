#!/bin/sh
# s32 final code: a model's draft (bucket 0) is not trimmed; greedy plain, hybrid, model
cd /work/main
S=/work/benchrun/s32
date
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid,model --out $S/greedy-final > $S/greedy-final.log 2>&1
date
