#!/bin/sh
# s47: issue 24's load test on 90a9e83 (catch-ups paid or weighed against free tokens, idle drafter re-measured), kernel avx512, defaults, then make demo
cd /work/main
O=/work/benchrun/s47/load
mkdir -p $O
while pgrep -f 'make test|pytest|augury bench|ab_bench|augury train|augury loadtest|llama-server' >/dev/null; do sleep 5; done
date; git log --oneline -1
.venv/bin/augury loadtest --offline --concurrency 1,16 --requests-per-client 10 --max-tokens 64 \
    --out $O/load-avx512.json > $O/load-avx512.log 2>&1
echo "load rc=$?"; date
make demo > $O/demo.log 2>&1
echo "demo rc=$?"; date
AUGURY_ISA=avx2 .venv/bin/augury loadtest --offline --concurrency 1,16 --requests-per-client 10 --max-tokens 64 \
    --out $O/load-avx2.json > $O/load-avx2.log 2>&1
echo "load avx2 rc=$?"; date
AUGURY_ISA=avx2 make demo > $O/demo-avx2.log 2>&1
echo "demo avx2 rc=$?"; date
