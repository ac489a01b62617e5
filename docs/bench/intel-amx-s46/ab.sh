#!/bin/sh
# Run on edfd12f into b3 (the three runs) and on 6652668 into b4 (the two avx512 runs only); ab_bench.py adds hybrid-old.
cd /work/main
O=/work/benchrun/s46/b4
mkdir -p $O
while pgrep -f 'make test|pytest|augury bench|augury train|augury loadtest|llama-server|bench3.sh' >/dev/null; do sleep 5; done
date; git log --oneline -1; git diff --stat
AUGURY_ISA=avx512 .venv/bin/python /work/benchrun/s46/ab_bench.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
    --out $O/greedy-avx512 > $O/greedy-avx512.log 2>&1
echo "greedy rc=$?"; date
AUGURY_ISA=avx512 .venv/bin/python /work/benchrun/s46/ab_bench.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
    --temperature 0.7 --top-p 0.95 --seed 1 --out $O/t07-avx512 > $O/t07-avx512.log 2>&1
echo "t07 rc=$?"; date
AUGURY_ISA=avx2 .venv/bin/python /work/benchrun/s46/ab_bench.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
    --out $O/greedy-avx2 > $O/greedy-avx2.log 2>&1
echo "greedy avx2 rc=$?"; date
