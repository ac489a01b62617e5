#!/bin/sh
# s43: issue 24's load test with --max-step-ms on the Zen 2 (AVX2), kernel avx2
cd /work/main
while pgrep -f 'pytest|augury bench|augury train|augury loadtest' >/dev/null; do sleep 5; done
date; git log --oneline -1
.venv/bin/augury loadtest --offline --concurrency 1,16 --requests-per-client 10 --max-tokens 64 \
    --max-step-ms ${MS:-170} --out /work/benchrun/s43/bound-$MS.json > /work/benchrun/s43/bound-$MS.log 2>&1
echo "rc=$?" >> /work/benchrun/s43/bound-$MS.log
date
