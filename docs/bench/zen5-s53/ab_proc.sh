#!/bin/bash
# A B A B in separate processes (two kernel builds cannot share one: their inline symbols interpose).
# Usage: ab_proc.sh SRC_A SRC_B ROUNDS [context]
A=$1; B=$2; N=$3; CTX=${4:-512}
for i in $(seq $N); do
  for s in $A $B; do echo -n "$s "; PYTHONPATH=$s python $(dirname $0)/fwd_rows.py $CTX 2>/dev/null; done
done
