#!/bin/sh
# s38 after the stealing change: A/B again, the cost curve, llama-bench tg, the demo
cd /work/main
S=/work/benchrun/s38
L=/work/peers-build/src/vendor/llama.cpp/build/bin
export LD_LIBRARY_PATH=$L
while pgrep -f 'pytest|augury bench|augury train|augury loadtest|augury demo|cc1plus' >/dev/null; do sleep 5; done
date
sed -i 's/for i in 1 2 3 4 5 6; do/for i in 1 2 3 4 5 6 7 8; do/' $S/ab_steal.sh
$S/ab_steal.sh > $S/ab_steal2.txt 2>&1
date
.venv/bin/augury profile --offline --weights gguf --rows 1,2,4,5,6,8,16 --context 512 > $S/profile-avx2-after.txt 2>&1
date
$L/llama-bench -m /root/.cache/augury/models/qwen2.5-coder-1.5b-instruct.gguf -t 2 -p 0 -n 64 -r 3 > $S/llama-bench-tg.txt 2>&1
date
.venv/bin/augury demo --offline > $S/demo-after.log 2>&1
date
