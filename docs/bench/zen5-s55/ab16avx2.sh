#!/bin/sh
# sched16.py with AUGURY_ISA=avx2: 972f26d (before the session) and the final code alternating, two rounds.
cd /work/main
export AUGURY_ISA=avx2
for round in 1 2; do
  for arm in old new; do
    if [ $arm = old ]; then P=/tmp/s55/old/src; else P=/work/main/src; fi
    echo "== $arm $round"
    PYTHONPATH=$P .venv/bin/python docs/bench/zen5-s52/sched16.py 2>&1 | grep -E "steps with|forward ms|argmax|first_largest"
  done
done
