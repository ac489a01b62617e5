#!/bin/sh
cd /work/main
O=/work/benchrun/s49/plan
mkdir -p $O
date; git log --oneline -1; git status --short
for run in "avx512 k4-greedy-avx512 --fixed-k" "avx2 k4-greedy-avx2 --fixed-k" "avx512 greedy-avx512" "avx2 greedy-avx2" "avx512 t07-avx512 --temperature 0.7 --top-p 0.95 --seed 1" "avx2 t07-avx2 --temperature 0.7 --top-p 0.95 --seed 1"; do
  set -- $run; isa=$1; name=$2; shift 2
  AUGURY_ISA=$isa .venv/bin/python /work/benchrun/s49/ab_guess.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid "$@" \
    --out $O/$name > $O/$name.log 2>&1
  echo "$name rc=$?"; date
done
echo ALL DONE
