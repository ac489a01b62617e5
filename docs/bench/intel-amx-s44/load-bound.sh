#!/bin/sh
# s44: issue 24's load test at 1 and 16 clients with --max-step-ms 150, kernel avx512
cd /work/main
while pgrep -f 'pytest|augury bench|augury train|augury loadtest' >/dev/null; do sleep 5; done
date; git log --oneline -1
.venv/bin/augury loadtest --offline --concurrency 1,16 --requests-per-client 10 --max-tokens 64 --max-step-ms 150 \
    --out /work/benchrun/s44/load-bound150.json > /work/benchrun/s44/load-bound150.log 2>&1
echo "rc=$?" >> /work/benchrun/s44/load-bound150.log
date
