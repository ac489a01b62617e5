#!/bin/sh
# More paired runs of the final code (5d564e2) against main's rules at 0335315 (hybrid-main), one process each.
cd /work/main
O=/work/benchrun/s47/b5
mkdir -p $O
while pgrep -f 'make test|pytest|augury bench|ab_main|augury loadtest' >/dev/null; do sleep 5; done
date; git log --oneline -1; git diff --stat
AUGURY_ISA=avx512 .venv/bin/python /work/benchrun/s47/ab_main.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
  --temperature 0.7 --top-p 0.95 --seed 3 --out $O/t07-avx512-3 > $O/t07-avx512-3.log 2>&1
echo "t07 3 rc=$?"; date
AUGURY_ISA=avx512 .venv/bin/python /work/benchrun/s47/ab_main.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
  --out $O/greedy-avx512-3 > $O/greedy-avx512-3.log 2>&1
echo "greedy 3 rc=$?"; date
AUGURY_ISA=avx2 .venv/bin/python /work/benchrun/s47/ab_main.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
  --out $O/greedy-avx2-2 > $O/greedy-avx2-2.log 2>&1
echo "greedy avx2 2 rc=$?"; date
AUGURY_ISA=avx2 .venv/bin/python /work/benchrun/s47/ab_main.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
  --temperature 0.7 --top-p 0.95 --seed 2 --out $O/t07-avx2-2 > $O/t07-avx2-2.log 2>&1
echo "t07 avx2 2 rc=$?"; date
