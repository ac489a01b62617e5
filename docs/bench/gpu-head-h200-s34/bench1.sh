#!/bin/sh
# s34: the eagle head trained on an H200 (2.3M tokens of stdlib states, 4.6M seen), on Spec-Bench
cd /work/main
A=.venv/bin/augury
S=/work/benchrun/s34
H=$S/gpu-eagle
B="--offline --suite spec-bench:2 --max-tokens 128"
while pgrep -f 'pytest|augury bench' >/dev/null; do sleep 5; done
date
$A bench $B --methods plain,eagle,hybrid,suffix --head $H --out $S/greedy-head > $S/greedy-head.log 2>&1
date
$A bench $B --methods eagle --head $H --fixed-k --k 4 --out $S/fixed4-head > $S/fixed4-head.log 2>&1
date
$A bench $B --methods plain,eagle,hybrid,suffix --head $H --temperature 0.7 --top-p 0.95 --seed 1 --out $S/sampled-head > $S/sampled-head.log 2>&1
date
AUGURY_ISA=avx2 $A bench $B --methods plain,eagle,hybrid --head $H --out $S/greedy-head-avx2 > $S/greedy-head-avx2.log 2>&1
date
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid,model,suffix --temperature 0.7 --top-p 0.95 --seed 1 --out /work/benchrun/s34/sampled-default > /work/benchrun/s34/sampled-default.log 2>&1
date
