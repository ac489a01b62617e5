#!/usr/bin/env bash
# s36: the AVX2 path (AUGURY_ISA=avx2) of 23a's chats and 23b's writers
cd /work/main && source .venv/bin/activate
export AUGURY_ISA=avx2
S=/work/benchrun/s36
date
augury loadtest --offline --suite $S/long-first.jsonl --concurrency 1 --requests-per-client 1 --min-requests 0 \
    --max-tokens 64 --chat-turns 5 --out $S/chats-long-avx2.json > $S/chats-long-avx2.log 2>&1
date
for spec in "scheduler 16" "waves 16"; do
  set -- $spec
  out=$S/writers/avx2-$1-$2
  rm -rf "$out"
  augury train --offline --kind eagle --corpus self --hours 0.07 --collect-share 0.9 \
      --max-batch $2 --self-writer $1 --intermediate-size 2048 --draft-vocab 16384 --quiet --out "$out" > "$out.log" 2>&1
  grep -h "collected" "$out.log"
  date
done
