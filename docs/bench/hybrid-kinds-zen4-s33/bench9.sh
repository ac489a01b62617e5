#!/bin/sh
# s33: the avx512 greedy run again (a slow spell of the host during the first one's math prompts: plain 9.8 tok/s there)
cd /work/main
while pgrep -f 'augury bench' >/dev/null; do sleep 5; done
date
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,suffix,hybrid,model --peers llamacpp-plain --llama-cpp /work/peers-build/src/vendor/llama.cpp/build/bin --out /work/benchrun/s33/greedy-avx512-2 > /work/benchrun/s33/greedy-avx512-2.log 2>&1
date
