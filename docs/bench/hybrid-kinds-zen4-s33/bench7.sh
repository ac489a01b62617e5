#!/bin/sh
# s33: issue 21's curve beside llama.cpp on both kernel paths, then every drafter with the hybrid that counts
# acceptance per draft kind (avx512 with llama.cpp plain beside it, then forced avx2).
cd /work/main
S=/work/benchrun/s33
BIN=/work/peers-build/src/vendor/llama.cpp/build/bin
P="--offline --weights gguf --rows 1,2,4,5,6,8,16 --context 512 --peers llamacpp --llama-cpp $BIN"
B="--offline --suite spec-bench:2 --max-tokens 128"
date
.venv/bin/augury profile $P > $S/profile-avx512-llama.txt 2>&1
date
AUGURY_ISA=avx2 .venv/bin/augury profile $P > $S/profile-avx2-llama.txt 2>&1
date
.venv/bin/augury bench $B --methods plain,suffix,hybrid,model --peers llamacpp-plain --llama-cpp $BIN --out $S/greedy-avx512 > $S/greedy-avx512.log 2>&1
date
AUGURY_ISA=avx2 .venv/bin/augury bench $B --methods plain,suffix,hybrid,model --out $S/greedy-avx2 > $S/greedy-avx2.log 2>&1
date
