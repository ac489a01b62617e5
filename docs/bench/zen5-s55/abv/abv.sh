#!/bin/sh
# Load test: 3a5b7e4 (before the cache views were made once) against the final code, alternating.
cd /work/main
O=/tmp/s55/abv
mkdir -p $O
for round in 1 2; do
  for arm in old new; do
    if [ $arm = old ]; then P=/tmp/s55/old/src; else P=/work/main/src; fi
    PYTHONPATH=$P .venv/bin/python -m augury.cli loadtest --offline --concurrency 1,16 --requests-per-client 10 --max-tokens 64 \
      --out $O/lt-$arm-$round.json > $O/lt-$arm-$round.log 2>&1
  done
done
echo ALL DONE
