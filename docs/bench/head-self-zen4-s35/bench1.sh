#!/bin/sh
# s35: the eagle head trained on this CPU from the target's own writing (self only), on Spec-Bench
cd /work/main
A=.venv/bin/augury
S=/work/benchrun/s35
H=$S/eagle-self
B="--offline --suite spec-bench:2 --max-tokens 128"
while pgrep -f 'pytest|augury bench|augury train' >/dev/null; do sleep 5; done
date
$A bench $B --methods plain,eagle,hybrid,suffix --head $H --out $S/greedy-head > $S/greedy-head.log 2>&1
date
$A bench $B --methods eagle --head $H --fixed-k --k 4 --out $S/fixed4-head > $S/fixed4-head.log 2>&1
date
$A bench $B --methods plain,eagle,hybrid,suffix --head $H --temperature 0.7 --top-p 0.95 --seed 1 --out $S/sampled-head > $S/sampled-head.log 2>&1
date
