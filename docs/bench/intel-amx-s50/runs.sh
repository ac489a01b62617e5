#!/bin/sh
# the planner's prior, paired (hybrid vs hybrid-oldprior), and issue 22's table with llama.cpp beside it
cd /work/main
O=/work/benchrun/s50/runs
mkdir -p $O
L=$HOME/.cache/llama-cpp-peer/src/vendor/llama.cpp/build/bin
export LLAMA_ARG_REPACK=0
date; git log --oneline -1; git status --short
.venv/bin/python /work/benchrun/s50/ab_prior.py bench --offline --suite spec-bench:2 --max-tokens 128 \
  --methods plain,hybrid,suffix,model --peers llamacpp --llama-cpp $L --out $O/full-greedy-avx512 > $O/full-greedy-avx512.log 2>&1
echo "full-greedy-avx512 rc=$?"; date
for run in "avx512 t07-avx512 --temperature 0.7 --top-p 0.95 --seed 1" "avx2 greedy-avx2" "avx2 t07-avx2 --temperature 0.7 --top-p 0.95 --seed 1"; do
  set -- $run; isa=$1; name=$2; shift 2; [ $isa = avx512 ] && isa=
  AUGURY_ISA=$isa .venv/bin/python /work/benchrun/s50/ab_prior.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid "$@" \
    --out $O/$name > $O/$name.log 2>&1
  echo "$name rc=$?"; date
done
for isa in "" avx2; do
  AUGURY_ISA=$isa .venv/bin/augury profile --offline --weights gguf --rows 1,2,4,5,6,8,16 --context 512 --peers llamacpp --llama-cpp $L \
    > $O/profile-${isa:-avx512}.txt 2>&1
  echo "profile ${isa:-avx512} rc=$?"; date
done
echo ALL DONE
