#!/bin/bash
# A/B: main before (34b460e, /work/ab-old) and after (working tree), plain/model/hybrid, greedy and T 0.7.
set -u
cd /work/main
B=/work/benchrun/s41
for temp in greedy; do
  extra=""
  [ $temp = sampled ] && extra="--temperature 0.7 --top-p 0.95 --seed 1"
  for ver in old new; do
    src=/work/ab-new/src; [ $ver = old ] && src=/work/ab-old/src
    PYTHONPATH=$src .venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 \
      --methods plain,model,hybrid $extra --no-progress --overwrite --out $B/ab3-$temp-$ver > $B/ab3-$temp-$ver.log 2>&1
    echo "$temp $ver done $(date)"
  done
done
