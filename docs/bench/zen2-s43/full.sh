#!/bin/sh
# s43: issue 24's recipe with --max-step-ms 145 (levels 1,4,16 and 5-turn chats), Zen 2 (AVX2), kernel avx2
cd /work/main
while pgrep -f 'pytest|augury bench|augury train|augury loadtest' >/dev/null; do sleep 5; done
date; git log --oneline -1
.venv/bin/augury loadtest --offline --concurrency 1,4,16 --requests-per-client 10 --max-tokens 64 --chat-turns 5 \
    --max-step-ms 145 --out /work/benchrun/s43/full-145.json > /work/benchrun/s43/full-145.log 2>&1
echo "rc=$?" >> /work/benchrun/s43/full-145.log
date
