#!/bin/sh
# sched16.py (16 greedy sequences in one Scheduler, in-process), old (972f26d worktree) and new alternating.
cd /work/main
for round in 1 2 3; do
  for arm in old new; do
    if [ $arm = old ]; then P=/tmp/s55/old/src; else P=/work/main/src; fi
    echo "== $arm $round"
    PYTHONPATH=$P .venv/bin/python docs/bench/zen5-s52/sched16.py 2>&1 | grep -E "steps with|forward ms|argmax|first_largest|greedy_tokens"
  done
done
