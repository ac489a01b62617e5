#!/bin/bash
cd /work/main
O=/work/benchrun/s45
.venv/bin/python $O/rows.py 5 40 > $O/perf5.log 2>&1 &
P=$!
sleep 25
perf record -F 4000 -p $P -o $O/perf5.data -- sleep 12 > /dev/null 2>&1
wait $P
perf report -i $O/perf5.data --no-children --sort symbol --percent-limit 0.5 --stdio 2>/dev/null | grep -v '^#' | grep -v '^$' | head -30
