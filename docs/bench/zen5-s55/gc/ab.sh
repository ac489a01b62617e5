#!/bin/sh
# The collector's time in the servers of one load test: 3a5b7e4, then the final code.
cd /work/main
O=/tmp/s55/gc
for arm in old new; do
  if [ $arm = old ]; then P=/tmp/s55/old/src; else P=/work/main/src; fi
  GC_TRACE=$O/gc-$arm PYTHONPATH=/tmp/s55/gc:$P .venv/bin/python -m augury.cli loadtest --offline --concurrency 1,16 \
    --requests-per-client 10 --max-tokens 64 --out $O/lt-$arm.json > $O/lt-$arm.log 2>&1
done
echo ALL DONE
