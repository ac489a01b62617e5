#!/usr/bin/env bash
# self-writing rate on this CPU: waves against the scheduler, same command otherwise
cd /work/main && source .venv/bin/activate
for spec in "waves 16" "scheduler 16" "waves 32"; do
  set -- $spec
  out=/work/benchrun/s36/writers/$1-$2
  rm -rf "$out"
  /usr/bin/time -v augury train --offline --kind eagle --corpus self --hours 0.1 --collect-share 0.9 \
      --max-batch $2 --self-writer $1 --intermediate-size 2048 --draft-vocab 16384 --quiet --out "$out" \
      > "$out.log" 2>&1
  python3 -c "import json,sys; m=json.load(open('$out/head.json')); print('$1 $2', m['data']['tokens'], m['data']['tokens_per_hour'], m['data'].get('sequences'))"
done
