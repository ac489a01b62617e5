#!/bin/sh
# s42: issue 22's run on the Zen 2 (AVX2), kernel avx2: every drafter beside llama.cpp, greedy and T 0.7
cd /work/main
L=/work/peers-build/src/vendor/llama.cpp/build/bin
while pgrep -f 'pytest|augury bench|augury train|augury loadtest|llama-server' >/dev/null; do sleep 5; done
date
git log --oneline -1
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid,suffix,model \
    --peers llamacpp --llama-cpp $L --out /work/benchrun/s42/greedy > /work/benchrun/s42/greedy.log 2>&1
echo "greedy rc=$?"; date
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid,suffix,model \
    --temperature 0.7 --top-p 0.95 --seed 1 --peers llamacpp --llama-cpp $L --out /work/benchrun/s42/sampled \
    > /work/benchrun/s42/sampled.log 2>&1
echo "sampled rc=$?"; date
