#!/bin/sh
# s32: the same change on the AVX2 path forced on this Zen 4
cd /work/main
S=/work/benchrun/s32
date
AUGURY_ISA=avx2 .venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,suffix,hybrid --out $S/greedy-avx2 > $S/greedy-avx2.log 2>&1
date
