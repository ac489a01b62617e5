#!/bin/sh
# s31: each head kind trained on the same states, plain beside it in the same run, greedy and T 0.7
set -x
cd /work/main
A=.venv/bin/augury
S=/work/benchrun/s31
B="--offline --suite spec-bench:2 --max-tokens 128"
for kind in eagle mtp parallel; do
  date
  $A bench $B --methods plain,$kind --head $S/$kind --out $S/greedy-$kind > $S/greedy-$kind.log 2>&1
  $A bench $B --methods plain,$kind --head $S/$kind --temperature 0.7 --top-p 0.95 --seed 1 \
     --out $S/sampled-$kind > $S/sampled-$kind.log 2>&1
  $A bench $B --methods $kind --head $S/$kind --fixed-k --k 4 --out $S/fixed4-$kind > $S/fixed4-$kind.log 2>&1
done
date
