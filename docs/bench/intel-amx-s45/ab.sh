#!/bin/bash
# A B A B timing of rows.py: A = /work/wt-old, B = /work/main (argv: rows list, seconds, rounds)
for k in $(seq 1 ${3:-3}); do
  echo -n "A "; PYTHONPATH=/work/wt-old/src /work/main/.venv/bin/python /work/benchrun/s45/rows.py $1 $2 2>&1 | tail -1
  echo -n "B "; PYTHONPATH=/work/main/src /work/main/.venv/bin/python /work/benchrun/s45/rows.py $1 $2 2>&1 | tail -1
done
