#!/bin/sh
# s38: Zen 2 (AVX2 only): the cost curve per path beside llama.cpp, the demo, every drafter greedy and T 0.7
cd /work/main
A=.venv/bin/augury
S=/work/benchrun/s38
L=/work/peers-build/src/vendor/llama.cpp/build/bin
export LD_LIBRARY_PATH=$L
while pgrep -f 'pytest|augury bench|augury train|augury loadtest|augury demo|cmake|ninja|cc1plus' >/dev/null; do sleep 5; done
date
$A profile --offline --weights gguf --rows 1,2,4,5,6,8,16 --context 512 --peers llamacpp --llama-cpp $L > $S/profile-avx2.txt 2>&1
date
AUGURY_ISA=portable $A profile --offline --weights gguf --rows 1,2,4,5,8 --context 512 > $S/profile-portable.txt 2>&1
date
$A demo --offline > $S/demo.log 2>&1
date
B="--offline --suite spec-bench:2 --max-tokens 128"
$A bench $B --methods plain,hybrid,suffix,model --peers llamacpp --llama-cpp $L --out $S/greedy > $S/greedy.log 2>&1
date
$A bench $B --methods plain,hybrid,suffix,model --temperature 0.7 --top-p 0.95 --seed 1 --out $S/sampled > $S/sampled.log 2>&1
date
