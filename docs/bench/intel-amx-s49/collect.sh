#!/bin/sh
# copy each run's summary and per-prompt / per-arm tables into the docs folder
D=/work/main/docs/bench/intel-amx-s49
P=/work/main/.venv/bin/python
cd /work/benchrun/s49
for set in guess guess2 fixed plan; do
  for run in $set/*/; do
    run=${run%/}; name=$(basename $run)
    [ -f $run/records.jsonl ] || continue
    case $name in *contaminated*) continue;; esac
    cp $run/summary.md $D/$set-$name.md
    $P ../s48/perprompt.py $run > $D/$set-$name-prompts.txt
    $P fwd.py $run > $D/$set-$name-forwards.txt
    $P ../s48/arms.py $run >> $D/arms.txt
  done
done
