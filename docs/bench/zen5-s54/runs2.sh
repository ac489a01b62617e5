#!/bin/sh
# Session 54, the final code (af68893): plain and the default hybrid, greedy and T 0.7, avx512, one more run each
cd /work/main
O=/tmp/s54/runs
for i in ${RUNS:-2}; do
  .venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid --out $O/greedy$i-avx512 > $O/greedy$i-avx512.log 2>&1
  .venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
    --temperature 0.7 --top-p 0.95 --seed 1 --out $O/t07-$i-avx512 > $O/t07-$i-avx512.log 2>&1
done
echo ALL DONE
