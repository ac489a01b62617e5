#!/bin/sh
# The hybrid with its 0.5B re-quantized to Q4_0 at load, against the default, one process each.
cd /work/main
O=/work/benchrun/s48/q40
mkdir -p $O
date; git log --oneline -1
AUGURY_ISA=avx512 .venv/bin/python /work/benchrun/s48/ab_q40.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
  --out $O/greedy-avx512-1 > $O/greedy-avx512-1.log 2>&1
echo "greedy 1 rc=$?"; date
AUGURY_ISA=avx512 .venv/bin/python /work/benchrun/s48/ab_q40.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
  --temperature 0.7 --top-p 0.95 --seed 1 --out $O/t07-avx512-1 > $O/t07-avx512-1.log 2>&1
echo "t07 1 rc=$?"; date
