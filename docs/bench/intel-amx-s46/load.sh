#!/bin/sh
# s46: issue 24's load test on 6652668 (the catch-up rules), kernel avx512, defaults, then make demo
cd /work/main
O=/work/benchrun/s46/load
mkdir -p $O
while pgrep -f 'make test|pytest|augury bench|ab_bench|augury train|augury loadtest|llama-server' >/dev/null; do sleep 5; done
date; git log --oneline -1
.venv/bin/augury loadtest --offline --concurrency 1,16 --requests-per-client 10 --max-tokens 64 \
    --out $O/load-avx512.json > $O/load-avx512.log 2>&1
echo "load rc=$?"; date
make demo > $O/demo.log 2>&1
echo "demo rc=$?"; date
