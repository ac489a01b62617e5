#!/bin/sh
# s32 after review: final code, every changed driver path on both kernel paths of this Zen 4
cd /work/main
S=/work/benchrun/s32
B="--offline --suite spec-bench:2 --max-tokens 128 --methods plain,suffix,hybrid,model"
date
AUGURY_ISA=avx2 .venv/bin/augury bench $B --out $S/final-avx2 > $S/final-avx2.log 2>&1
date
.venv/bin/augury bench $B --out $S/final-avx512 > $S/final-avx512.log 2>&1
date
