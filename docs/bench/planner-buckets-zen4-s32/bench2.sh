#!/bin/sh
# s32: the hybrid's plan weighs its model alone (bucket-0 tally, model rounds' cost); greedy and T 0.7
cd /work/main
A=.venv/bin/augury
S=/work/benchrun/s32
B="--offline --suite spec-bench:2 --max-tokens 128"
date
$A bench $B --methods plain,suffix,hybrid --out $S/greedy-hybrid2 > $S/greedy-hybrid2.log 2>&1
date
$A bench $B --methods plain,hybrid --head /work/benchrun/s31/mtp --out $S/greedy-hybrid-mtp2 > $S/greedy-hybrid-mtp2.log 2>&1
date
$A bench $B --methods plain,suffix,hybrid --temperature 0.7 --top-p 0.95 --seed 1 --out $S/sampled-hybrid2 > $S/sampled-hybrid2.log 2>&1
date
