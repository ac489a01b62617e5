#!/bin/sh
# Run twice: with O=.../guess on the uncommitted first-forward version (5c39b6d without its row cap), then O=.../guess2 on 94e00fa
cd /work/main
O=/work/benchrun/s49/guess2
mkdir -p $O
date; git log --oneline -1; git status --short
for run in "avx512 greedy-avx512-1" "avx2 greedy-avx2-1" "avx512 t07-avx512-1 --temperature 0.7 --top-p 0.95 --seed 1" "avx2 t07-avx2-1 --temperature 0.7 --top-p 0.95 --seed 1"; do
  set -- $run; isa=$1; name=$2; shift 2
  AUGURY_ISA=$isa .venv/bin/python /work/benchrun/s49/ab_guess.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid "$@" \
    --out $O/$name > $O/$name.log 2>&1
  echo "$name rc=$?"; date
done
