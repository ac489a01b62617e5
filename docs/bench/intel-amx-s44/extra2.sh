#!/bin/sh
# s44: greedy-avx2 again: the first run overlapped a one-core prototype timing (amx/micro) for ~20 s
cd /work/main
export PYTHONPATH=/work/wt44/src
O=/work/benchrun/s44
while pgrep -f 'pytest|augury bench|augury train|augury loadtest|llama-server|bench.sh|extra.sh' >/dev/null; do sleep 5; done
date
AUGURY_ISA=avx2 .venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid,suffix,model \
    --out $O/greedy-avx2-b > $O/greedy-avx2-b.log 2>&1
echo "greedy avx2 b rc=$?"; date
