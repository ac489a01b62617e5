#!/bin/sh
cd /work/main
O=/work/benchrun/s50/runs
date; git log --oneline -1
AUGURY_ISA=avx2 .venv/bin/augury bench --offline --suite spec-bench:2 --max-tokens 128 --methods plain,hybrid,model --out $O/model-greedy-avx2 > $O/model-greedy-avx2.log 2>&1
echo "model-greedy-avx2 rc=$?"; date
echo ALL DONE
