#!/bin/sh
# s44: issue 24's load test at 1 and 16 clients with the defaults (no --max-step-ms), kernel avx512
cd /work/main
while pgrep -f 'pytest|augury bench|augury train|augury loadtest' >/dev/null; do sleep 5; done
date; git log --oneline -1
.venv/bin/augury loadtest --offline --concurrency 1,16 --requests-per-client 10 --max-tokens 64 \
    --out /work/benchrun/s44/load-default.json > /work/benchrun/s44/load-default.log 2>&1
echo "rc=$?" >> /work/benchrun/s44/load-default.log
date
