#!/bin/sh
# s42: issue 24's recipe beside llama-server on the Zen 2 (AVX2), kernel avx2, main at fcf5774
cd /work/main
L=/work/peers-build/src/vendor/llama.cpp/build/bin
G=/root/.cache/augury/models/qwen2.5-coder-1.5b-instruct.gguf
while pgrep -f 'pytest|augury bench|augury train|augury loadtest' >/dev/null; do sleep 5; done
date
LD_LIBRARY_PATH=$L $L/llama-server -m $G -t 2 -np 16 -cb -c 32768 --port 8091 > /work/benchrun/s42/llama-server.log 2>&1 &
PID=$!
sleep 15
.venv/bin/augury loadtest --offline --concurrency 1,4,16 --requests-per-client 10 --max-tokens 64 --chat-turns 5 \
    --endpoint http://127.0.0.1:8091 --endpoint-label llama-server --endpoint-pid $PID \
    --out /work/benchrun/s42/loadtest-zen2-s42.json > /work/benchrun/s42/loadfull.log 2>&1
echo "rc=$?" >> /work/benchrun/s42/loadfull.log
kill $PID
date
