#!/bin/sh
cd /work/main
.venv/bin/augury serve --offline --draft-method model --max-batch 16 --kv-budget-tokens 32768 --max-tokens-limit 64 --max-step-ms 145 --port 8093 --log-level warning > /work/benchrun/s43/diag-serve.log 2>&1 &
PID=$!
for i in $(seq 120); do curl -s http://127.0.0.1:8093/health >/dev/null && break; sleep 2; done
.venv/bin/augury loadtest --offline --concurrency 1,16 --requests-per-client 10 --max-tokens 64 --endpoint http://127.0.0.1:8093 --endpoint-label diag --endpoint-only --endpoint-pid $PID > /work/benchrun/s43/diag.log 2>&1
kill $PID
