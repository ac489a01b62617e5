#!/bin/sh
# Zen 5 (session 51): the demo, issue 21's profile on both paths, issue 22's table beside llama.cpp
cd /work/main
O=/work/benchrun/s51/runs
mkdir -p $O
L=$HOME/.cache/llama-cpp-peer/src/vendor/llama.cpp/build/bin
date; git log --oneline -1; git status --short
.venv/bin/augury demo --offline > $O/demo-avx512.txt 2>&1; echo "demo rc=$?"; date
for isa in "" avx2; do
  AUGURY_ISA=$isa .venv/bin/augury profile --offline --weights gguf --rows 1,2,4,5,6,8,16 --context 512 --peers llamacpp --llama-cpp $L \
    > $O/profile-${isa:-avx512}.txt 2>&1
  echo "profile ${isa:-avx512} rc=$?"; date
done
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 \
  --methods plain,hybrid,suffix,model --peers llamacpp --llama-cpp $L --out $O/greedy-avx512 > $O/greedy-avx512.log 2>&1
echo "greedy-avx512 rc=$?"; date
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
  --temperature 0.7 --top-p 0.95 --seed 1 --out $O/t07-avx512 > $O/t07-avx512.log 2>&1
echo "t07-avx512 rc=$?"; date
AUGURY_ISA=avx2 .venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
  --peers llamacpp --llama-cpp $L --out $O/greedy-avx2 > $O/greedy-avx2.log 2>&1
echo "greedy-avx2 rc=$?"; date
AUGURY_ISA=avx2 .venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
  --temperature 0.7 --top-p 0.95 --seed 1 --out $O/t07-avx2 > $O/t07-avx2.log 2>&1
echo "t07-avx2 rc=$?"; date
echo ALL DONE
