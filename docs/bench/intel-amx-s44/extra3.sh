#!/bin/sh
# s44: T 0.7 on the forced avx2 path
cd /work/main
O=/work/benchrun/s44
while pgrep -f 'pytest|augury bench|augury train|augury loadtest|llama-server' >/dev/null; do sleep 5; done
date
AUGURY_ISA=avx2 .venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid,suffix,model \
    --temperature 0.7 --top-p 0.95 --seed 1 --out $O/sampled-avx2 > $O/sampled-avx2.log 2>&1
echo "sampled avx2 rc=$?"; date
