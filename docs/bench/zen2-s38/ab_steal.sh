#!/bin/sh
# A/B: static tile shares (old, 667a206 in /work/ab-old) against stealing (new, /work/main), plain decode tok/s
cd /work/main
for i in 1 2 3 4 5 6 7 8; do
  for v in old new; do
    if [ $v = old ]; then P=/work/ab-old/src; else P=/work/main/src; fi
    r=$(PYTHONPATH=$P .venv/bin/augury generate --offline --draft-method plain --max-tokens 160 --ignore-eos --chat "Write a long story about a lighthouse keeper." 2>&1 >/dev/null | grep '\[plain\]')
    echo "$i $v $r"
  done
done
