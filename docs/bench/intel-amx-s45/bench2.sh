#!/bin/sh
# s45: after make test: llama-bench tg32, issue 22's Spec-Bench run (greedy, with llama.cpp), issue 24's recipe beside llama-server; kernel avx512
cd /work/main
L=/work/peers-build/src/vendor/llama.cpp/build/bin
G=/root/.cache/augury/models/qwen2.5-coder-1.5b-instruct.gguf
O=/work/benchrun/s45/b2
mkdir -p $O
export LLAMA_ARG_REPACK=0  # llama.cpp's AMX path dies of SIGILL on this VM (section 31)
while pgrep -f 'pytest|augury bench|augury train|augury loadtest|llama-server' >/dev/null; do sleep 5; done
date; git log --oneline -1
LD_LIBRARY_PATH=$L $L/llama-bench -m $G -t 2 -p 0 -n 32 -r 3 --repack 0 > $O/llama-tg32.txt 2>&1; echo "llama tg32 rc=$?"
.venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid,suffix,model \
    --peers llamacpp --llama-cpp $L --out $O/greedy > $O/greedy.log 2>&1
echo "greedy rc=$?"; date
LD_LIBRARY_PATH=$L $L/llama-server -m $G -t 2 -np 16 -cb -c 32768 --port 8091 > $O/llama-server.log 2>&1 &
PID=$!
sleep 15
.venv/bin/augury loadtest --offline --concurrency 1,4,16 --requests-per-client 10 --max-tokens 64 --chat-turns 5 \
    --endpoint http://127.0.0.1:8091 --endpoint-label llama-server --endpoint-pid $PID \
    --out $O/loadfull.json > $O/loadfull.log 2>&1
echo "loadfull rc=$?"
kill $PID
date
