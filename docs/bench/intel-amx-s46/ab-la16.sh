#!/bin/sh
cd /work/main
O=/work/benchrun/s46/b5
mkdir -p $O
date; git log --oneline -1
AUGURY_ISA=avx512 .venv/bin/python /work/benchrun/s46/ab_la.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
    --out $O/greedy-avx512 > $O/greedy-avx512.log 2>&1
echo "greedy rc=$?"; date
AUGURY_ISA=avx512 .venv/bin/python /work/benchrun/s46/ab_la.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
    --temperature 0.7 --top-p 0.95 --seed 1 --out $O/t07-avx512 > $O/t07-avx512.log 2>&1
echo "t07 rc=$?"; date
