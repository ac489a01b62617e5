#!/bin/sh
# Paired runs of branch cheap-start (hybrid) against main's cap (hybrid-cap) and 279dc01's rules (hybrid-old), in one process each.
cd /work/main
O=/work/benchrun/s47/b1
mkdir -p $O
export PYTHONPATH=/work/wt-cheap/src
date; git -C /work/wt-cheap log --oneline -1
for r in 1 2 3; do
  AUGURY_ISA=avx512 .venv/bin/python /work/benchrun/s46/ab_cheap.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
    --out $O/greedy-avx512-$r > $O/greedy-avx512-$r.log 2>&1
  echo "greedy $r rc=$?"; date
  AUGURY_ISA=avx512 .venv/bin/python /work/benchrun/s46/ab_cheap.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
    --temperature 0.7 --top-p 0.95 --seed $r --out $O/t07-avx512-$r > $O/t07-avx512-$r.log 2>&1
  echo "t07 $r rc=$?"; date
done
for r in 1 2; do
  AUGURY_ISA=avx2 .venv/bin/python /work/benchrun/s46/ab_cheap.py bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid \
    --out $O/greedy-avx2-$r > $O/greedy-avx2-$r.log 2>&1
  echo "greedy avx2 $r rc=$?"; date
done
