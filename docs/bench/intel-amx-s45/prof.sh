#!/bin/sh
# s45: issue 21's curve on avx512 (with llama.cpp, repacking off) and avx2, twice each, interleaved; then the in-process A/B of the attention change
cd /work/main
L=/work/peers-build/src/vendor/llama.cpp/build/bin
O=/work/benchrun/s45/prof
export LLAMA_ARG_REPACK=0
while pgrep -f 'pytest|augury bench|augury loadtest|llama-server' >/dev/null; do sleep 5; done
date
.venv/bin/augury profile --offline --weights gguf --rows 1,2,4,5,6,8,16 --peers llamacpp --llama-cpp $L > $O/profile-avx512-a.txt 2>&1; echo "avx512 a rc=$?"
AUGURY_ISA=avx2 .venv/bin/augury profile --offline --weights gguf --rows 1,2,4,5,6,8,16 > $O/profile-avx2-a.txt 2>&1; echo "avx2 a rc=$?"
.venv/bin/augury profile --offline --weights gguf --rows 1,2,4,5,6,8,16 > $O/profile-avx512-b.txt 2>&1; echo "avx512 b rc=$?"
AUGURY_ISA=avx2 .venv/bin/augury profile --offline --weights gguf --rows 1,2,4,5,6,8,16 > $O/profile-avx2-b.txt 2>&1; echo "avx2 b rc=$?"
OLD=/root/.cache/augury/kernels/gguf-149cdab2d0f02e2e/augury_gguf_149cdab2d0f02e2e.so
.venv/bin/python /work/benchrun/s45/ab1.py $OLD 1,2,5,8,16 8 2.5 > $O/ab-avx512.txt 2>&1; echo "ab avx512 rc=$?"
AUGURY_ISA=avx2 .venv/bin/python /work/benchrun/s45/ab1.py $OLD 1,2,5,8,16 8 2.5 > $O/ab-avx2.txt 2>&1; echo "ab avx2 rc=$?"
date
