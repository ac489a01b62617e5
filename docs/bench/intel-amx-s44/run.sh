#!/bin/bash
cd /work/main
O=/work/benchrun/s44/perf
while pgrep -f 'pytest|augury bench|extra2.sh' >/dev/null; do sleep 5; done
for R in 1 5; do
  .venv/bin/python $O/steps.py $R 40 > $O/steps-$R.log 2>&1 &
  P=$!
  until grep -q ready $O/steps-$R.log; do sleep 1; done
  perf record -F 2000 -p $P -o $O/perf-$R.data -- sleep 20 > /dev/null 2>&1
  wait $P
  perf report -i $O/perf-$R.data --no-children --sort dso,symbol --percent-limit 0.7 --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40 > $O/report-$R.txt
done
date
