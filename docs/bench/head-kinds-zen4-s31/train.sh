#!/bin/sh
# s31: three head kinds on the same collected states (issue 23's "each kind on the same states")
set -x
cd /work/main
A=.venv/bin/augury
S=/work/benchrun/s31
C="--model qwen2.5-coder-1.5b-instruct --intermediate-size 2048 --draft-vocab 16384 --offline --quiet"
date
$A train $C --kind eagle --hours 0.62 --collect-share 0.5 --max-steps 420 --corpus self,stdlib --max-batch 16 \
   --curve-at 50000,100000,200000,400000 --out $S/eagle > $S/eagle.log 2>&1
date
$A train $C --kind mtp --feature final --features-from $S/eagle --hours 0.3 --max-steps 420 \
   --curve-at 50000,100000,200000,400000 --out $S/mtp > $S/mtp.log 2>&1
date
$A train $C --kind parallel --features-from $S/eagle --hours 0.3 --max-steps 420 \
   --curve-at 50000,100000,200000,400000 --out $S/parallel > $S/parallel.log 2>&1
date
