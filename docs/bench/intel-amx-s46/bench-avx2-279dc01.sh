#!/bin/sh
# s45 (review): the forced-avx2 path's Spec-Bench greedy run and load test at 1 and 16 clients, on main after the review
cd /work/main
O=/work/benchrun/s45/b3
mkdir -p $O
while pgrep -f 'make test|pytest|augury bench|augury train|augury loadtest|llama-server' >/dev/null; do sleep 5; done
date; git log --oneline -1
AUGURY_ISA=avx2 .venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid,suffix,model \
    --out $O/greedy-avx2 > $O/greedy-avx2.log 2>&1
echo "greedy avx2 rc=$?"; date
AUGURY_ISA=avx2 .venv/bin/augury loadtest --offline --concurrency 1,16 --requests-per-client 10 --max-tokens 64 \
    --out $O/load-avx2.json > $O/load-avx2.log 2>&1
echo "load avx2 rc=$?"; date
