#!/bin/sh
# Paired runs: the working tree (cheap catch-ups paid, dear ones weighed against free tokens, idle drafter re-measured) against main's rules (hybrid-main).
cd /work/main
O=/work/benchrun/s47/b4
mkdir -p $O
while pgrep -f 'make test|pytest|augury bench|ab_cheap|augury loadtest' >/dev/null; do sleep 5; done
date; git log --oneline -1; git diff --stat
for r in 1 2; do
  AUGURY_ISA=avx512 .venv/bin/python /work/benchrun/s47/ab_main.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
    --temperature 0.7 --top-p 0.95 --seed $r --out $O/t07-avx512-$r > $O/t07-avx512-$r.log 2>&1
  echo "t07 $r rc=$?"; date
  AUGURY_ISA=avx512 .venv/bin/python /work/benchrun/s47/ab_main.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
    --out $O/greedy-avx512-$r > $O/greedy-avx512-$r.log 2>&1
  echo "greedy $r rc=$?"; date
done
AUGURY_ISA=avx2 .venv/bin/python /work/benchrun/s47/ab_main.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
    --temperature 0.7 --top-p 0.95 --seed 1 --out $O/t07-avx2-1 > $O/t07-avx2-1.log 2>&1
echo "t07 avx2 rc=$?"; date
AUGURY_ISA=avx2 .venv/bin/python /work/benchrun/s47/ab_main.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
    --out $O/greedy-avx2-1 > $O/greedy-avx2-1.log 2>&1
echo "greedy avx2 rc=$?"; date
