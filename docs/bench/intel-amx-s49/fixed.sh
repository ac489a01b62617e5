#!/bin/sh
cd /work/main
O=/work/benchrun/s49/fixed
mkdir -p $O
date; git log --oneline -1; git status --short
for run in "avx512 greedy-avx512-k4" "avx2 greedy-avx2-k4"; do
  set -- $run; isa=$1; name=$2; shift 2
  AUGURY_ISA=$isa .venv/bin/python /work/benchrun/s49/ab_guess.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid --fixed-k "$@" \
    --out $O/$name > $O/$name.log 2>&1
  echo "$name rc=$?"; date
done
