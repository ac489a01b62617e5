#!/bin/sh
# s32: per-bucket trimming; greedy plain, suffix, hybrid (0.5B fallback), model; then hybrid with the s31 mtp head
cd /work/main
A=.venv/bin/augury
S=/work/benchrun/s32
B="--offline --suite spec-bench:2 --max-tokens 128"
date
$A bench $B --methods plain,suffix,hybrid,model --out $S/greedy-all > $S/greedy-all.log 2>&1
date
$A bench $B --methods plain,hybrid --head /work/benchrun/s31/mtp --out $S/greedy-hybrid-mtp > $S/greedy-hybrid-mtp.log 2>&1
date
