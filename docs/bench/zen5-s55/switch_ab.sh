#!/bin/sh
# A/B the GIL switch interval in the load test: default (5 ms) against SWITCH_S, alternating.
cd /work/main
O=/tmp/s55/swi
for round in 1 2; do
  for arm in default 0.0005; do
    if [ $arm = default ]; then unset SWITCH_S; else export SWITCH_S=$arm; fi
    PYTHONPATH=/tmp/s55/swi .venv/bin/augury loadtest --offline --concurrency 1,16 --requests-per-client 10 --max-tokens 64 \
      --out $O/lt-$arm-$round.json > $O/lt-$arm-$round.log 2>&1
  done
done
echo ALL DONE
