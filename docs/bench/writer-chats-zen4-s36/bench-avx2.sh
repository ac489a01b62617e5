#!/bin/sh
# s36: the default methods on the AVX2 path of this Zen 4 (AUGURY_ISA=avx2), greedy then T 0.7
cd /work/main
A=.venv/bin/augury
S=/work/benchrun/s36
L=/work/peers-build/src/vendor/llama.cpp/build/bin
B="--offline --suite spec-bench:2 --max-tokens 128"
while pgrep -f 'pytest|augury bench|augury train|augury loadtest' >/dev/null; do sleep 5; done
date
AUGURY_ISA=avx2 $A bench $B --methods plain,hybrid,suffix --peers llamacpp --llama-cpp $L --out $S/greedy-avx2 > $S/greedy-avx2.log 2>&1
date
AUGURY_ISA=avx2 $A bench $B --methods plain,hybrid,suffix --temperature 0.7 --top-p 0.95 --seed 1 --out $S/sampled-avx2 > $S/sampled-avx2.log 2>&1
date
