#!/bin/sh
# Session 54, final code: the forced AVX2 path on this AVX-512 CPU: plain and hybrid greedy and T 0.7, then the load test
cd /work/main
O=/tmp/s54/runs
export AUGURY_ISA=avx2
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid --out $O/greedy-final-avx2 > $O/greedy-final-avx2.log 2>&1
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
  --temperature 0.7 --top-p 0.95 --seed 1 --out $O/t07-final-avx2 > $O/t07-final-avx2.log 2>&1
.venv/bin/augury loadtest --offline --concurrency 1,16 --requests-per-client 10 --max-tokens 64 \
  --out docs/bench/zen5-s54/loadtest-final-avx2.json > docs/bench/zen5-s54/loadtest-final-avx2.log 2>&1
echo ALL DONE
