#!/bin/sh
# issue 24's recipe on Zen 5: augury's two servers at their defaults and llama-server -np 16 -cb, one run
cd /work/main
O=/work/benchrun/s51/runs
L=$HOME/.cache/llama-cpp-peer/src/vendor/llama.cpp/build/bin
T=$HOME/.cache/augury/models/qwen2.5-coder-1.5b-instruct.gguf
date; git log --oneline -1
$L/llama-server -m $T -t 2 -np 16 -cb -c 32768 --host 127.0.0.1 --port 8091 > $O/llama-server.log 2>&1 &
LS=$!
for i in $(seq 60); do curl -s http://127.0.0.1:8091/health | grep -q ok && break; sleep 2; done
.venv/bin/augury loadtest --offline --concurrency 1,4,16 --requests-per-client 10 --max-tokens 64 --chat-turns 5 \
  --endpoint http://127.0.0.1:8091 --endpoint-label llama-server --endpoint-pid $LS \
  --out $O/loadtest-avx512.json > $O/loadtest-avx512.log 2>&1
echo "loadtest rc=$?"; date
kill $LS; wait $LS 2>/dev/null
echo ALL DONE
