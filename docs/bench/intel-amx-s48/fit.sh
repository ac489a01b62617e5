#!/bin/sh
cd /work/main
O=/work/benchrun/s48/fit
mkdir -p $O
export PYTHONPATH=/work/wt-q40/src
date; (cd /work/wt-q40; git log --oneline -1; git status --short)
for run in "greedy-avx512-1" "t07-avx512-1 --temperature 0.7 --top-p 0.95 --seed 1" "greedy-avx512-2" "t07-avx512-2 --temperature 0.7 --top-p 0.95 --seed 2"; do
  set -- $run; name=$1; shift
  AUGURY_ISA=avx512 .venv/bin/python /work/benchrun/s48/ab_fit.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid "$@" \
    --out $O/$name > $O/$name.log 2>&1
  echo "$name rc=$?"; date
done
