#!/bin/sh
# A/B: the server's HTTP thread at nice 10 against the default, alternating, in the load test.
cd /work/main
O=/tmp/s55/nice
for round in 1 2; do
  for arm in default 10; do
    if [ $arm = default ]; then unset NICE_HTTP; else export NICE_HTTP=$arm; fi
    PYTHONPATH=/tmp/s55/nice .venv/bin/augury loadtest --offline --concurrency 1,16 --requests-per-client 10 --max-tokens 64 \
      --out $O/lt-$arm-$round.json > $O/lt-$arm-$round.log 2>&1
  done
done
echo ALL DONE
