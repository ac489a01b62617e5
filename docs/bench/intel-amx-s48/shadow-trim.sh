#!/bin/sh
cd /work/main
O=/work/benchrun/s48/shadow-trim
mkdir -p $O
while pgrep -f 'final.sh|make test|pytest|augury bench|ab_' >/dev/null; do sleep 5; done
export PYTHONPATH=/work/wt-shadow/src
date; (cd /work/wt-shadow; git log --oneline -1; git status --short)
for run in "avx2 greedy-avx2-1" "avx512 greedy-avx512-1" "avx2 t07-avx2-1 --temperature 0.7 --top-p 0.95 --seed 1" "avx512 t07-avx512-1 --temperature 0.7 --top-p 0.95 --seed 1"; do
  set -- $run; isa=$1; name=$2; shift 2
  AUGURY_ISA=$isa .venv/bin/python /work/benchrun/s48/ab_shadow.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid "$@" \
    --out $O/$name > $O/$name.log 2>&1
  echo "$name rc=$?"; date
done
