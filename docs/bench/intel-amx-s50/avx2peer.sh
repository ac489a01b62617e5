#!/bin/sh
cd /work/main
O=/work/benchrun/s50/runs
L=$HOME/.cache/llama-cpp-peer/src/vendor/llama.cpp/build/bin
export LLAMA_ARG_REPACK=0
date; git log --oneline -1
AUGURY_ISA=avx2 .venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid --peers llamacpp --llama-cpp $L --out $O/peer-greedy-avx2 > $O/peer-greedy-avx2.log 2>&1
echo "peer-greedy-avx2 rc=$?"; date
echo ALL DONE
