#!/bin/sh
# Session 55, 3a5b7e4 (the greedy pick through the kernel): issue 22's greedy table beside llama.cpp and the T 0.7 pair, avx512
cd /work/main
O=/tmp/s55/runs
mkdir -p $O
L=$HOME/.cache/llama-cpp-peer/src/vendor/llama.cpp/build/bin
date; git log --oneline -1
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 \
  --methods plain,hybrid,suffix,model --peers llamacpp --llama-cpp $L --out $O/greedy-avx512 > $O/greedy-avx512.log 2>&1
echo "greedy-avx512 rc=$?"; date
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
  --temperature 0.7 --top-p 0.95 --seed 1 --out $O/t07-avx512 > $O/t07-avx512.log 2>&1
echo "t07-avx512 rc=$?"; date
AUGURY_ISA=avx2 .venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
  --out $O/greedy-avx2 > $O/greedy-avx2.log 2>&1
echo "greedy-avx2 rc=$?"; date
echo ALL DONE
