#!/bin/sh
# s37: the planner's probe start (bab5615) against the code before it (b69f5b8), plain + hybrid, spec-bench:2
cd /work/main
S=/work/benchrun/s37
B="--offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid"
while pgrep -f 'pytest|augury bench|augury train|augury loadtest' >/dev/null; do sleep 5; done
for rep in 1 2; do
for samp in greedy t07; do
  case $samp in greedy) X="";; t07) X="--temperature 0.7 --top-p 0.95 --seed 1";; esac
  for isa in avx512 avx2; do
    for code in before after; do
      case $code in before) PP=$S/before/src;; after) PP=;; esac
      date; echo "$rep $samp $isa $code"
      AUGURY_ISA=$isa PYTHONPATH=$PP .venv/bin/augury bench $B $X --out $S/ab/$rep-$samp-$isa-$code > $S/ab/$rep-$samp-$isa-$code.log 2>&1
    done
  done
done
done
date
