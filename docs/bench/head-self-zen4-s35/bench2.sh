#!/bin/sh
# s35: the hybrid's draft model reading only the last 256 prompt tokens (--draft-context 256) against all of them
cd /work/main
A=.venv/bin/augury
S=/work/benchrun/s35
B="--offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid"
T="--temperature 0.7 --top-p 0.95 --seed 1"
while pgrep -f 'pytest|augury bench|augury train' >/dev/null; do sleep 5; done
date
$A bench $B --out $S/greedy-ctx0 > $S/greedy-ctx0.log 2>&1
date
$A bench $B --draft-context 256 --out $S/greedy-ctx256 > $S/greedy-ctx256.log 2>&1
date
$A bench $B $T --out $S/sampled-ctx0 > $S/sampled-ctx0.log 2>&1
date
$A bench $B $T --draft-context 256 --out $S/sampled-ctx256 > $S/sampled-ctx256.log 2>&1
date
