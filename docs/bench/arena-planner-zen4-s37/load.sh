#!/bin/sh
cd /work/main
while pgrep -f 'pytest|augury bench|augury train|augury loadtest' >/dev/null; do sleep 5; done
date
.venv/bin/augury loadtest --offline --concurrency 1,4,16 --requests-per-client 10 --max-tokens 64 --out /work/benchrun/s37/load-arena.json > /work/benchrun/s37/load-arena.log 2>&1
date
