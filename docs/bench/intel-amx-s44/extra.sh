#!/bin/sh
# s44: after bench.sh: matmul-only curves (the step's breakdown), the avxvnni path, llama-bench tg32 without repacking
cd /work/main
export PYTHONPATH=/work/wt44/src
L=/work/peers-build/src/vendor/llama.cpp/build/bin
O=/work/benchrun/s44
M=$HOME/.cache/augury/models/qwen2.5-coder-1.5b-instruct.gguf
while pgrep -f 'pytest|augury bench|augury train|augury loadtest|llama-server|bench.sh' >/dev/null; do sleep 5; done
date
.venv/bin/python -m augury.kernels.bench $M --rows 1,2,4,5,8,16 > $O/matmul-avx512.txt 2>&1; echo "matmul avx512 rc=$?"
AUGURY_ISA=avx2 .venv/bin/python -m augury.kernels.bench $M --rows 1,2,4,5,8,16 > $O/matmul-avx2.txt 2>&1; echo "matmul avx2 rc=$?"
AUGURY_ISA=avxvnni .venv/bin/augury profile --offline --weights gguf --rows 1,2,4,5,6,8,16 > $O/profile-avxvnni.txt 2>&1; echo "profile avxvnni rc=$?"
LD_LIBRARY_PATH=$L $L/llama-bench -m $M -t 2 -p 0 -n 32 -r 3 --repack 0 > $O/llama-tg32.txt 2>&1; echo "llama tg32 rc=$?"
date
