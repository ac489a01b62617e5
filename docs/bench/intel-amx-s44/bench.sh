#!/bin/sh
# s44: Intel Xeon with AMX (family 6 model 207): issue 21's cost curve and issue 22's run, avx512 and forced avx2
cd /work/main
export PYTHONPATH=/work/wt44/src
L=/work/peers-build/src/vendor/llama.cpp/build/bin
O=/work/benchrun/s44
export LLAMA_ARG_REPACK=0  # llama.cpp AMX path dies of SIGILL on this VM (tilezero)
while pgrep -f 'pytest|augury bench|augury train|augury loadtest|llama-server|cmake|c\+\+ ' >/dev/null; do sleep 5; done
date; git log --oneline -1
.venv/bin/augury profile --offline --weights gguf --rows 1,2,4,5,6,8,16 --peers llamacpp --llama-cpp $L > $O/profile-avx512.txt 2>&1
echo "profile avx512 rc=$?"; date
AUGURY_ISA=avx2 .venv/bin/augury profile --offline --weights gguf --rows 1,2,4,5,6,8,16 > $O/profile-avx2.txt 2>&1
echo "profile avx2 rc=$?"; date
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid,suffix,model \
    --peers llamacpp --llama-cpp $L --out $O/greedy > $O/greedy.log 2>&1
echo "greedy rc=$?"; date
AUGURY_ISA=avx2 .venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid,suffix,model \
    --out $O/greedy-avx2 > $O/greedy-avx2.log 2>&1
echo "greedy avx2 rc=$?"; date
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid,suffix,model \
    --temperature 0.7 --top-p 0.95 --seed 1 --peers llamacpp --llama-cpp $L --out $O/sampled > $O/sampled.log 2>&1
echo "sampled rc=$?"; date
