#!/bin/sh
# Old (main before this session, 2416dc0) against new csrc/, alternating, one thread: kernel_cycles (TSC cycles a row
# and sub-block, tiles in L2) and attention_cycles (TSC kcycles a layer). Usage: cycles_ab.sh OLD_CSRC
OLD=$1; NEW=src/augury/kernels/csrc
F="-std=c++17 -O3 -fopenmp -ffp-contract=off -Wno-psabi -Itests/cross/shim"
g++ $F -I$OLD scripts/kernel_cycles.cpp -o /tmp/kc_old && g++ $F -I$NEW scripts/kernel_cycles.cpp -o /tmp/kc_new
g++ $F -I$OLD scripts/attention_cycles.cpp -o /tmp/ac_old && g++ $F -I$NEW scripts/attention_cycles.cpp -o /tmp/ac_new
export OMP_NUM_THREADS=1
for isa in avx512 avx2; do
  for k in 5 7 2 4; do for r in 1 5 8 16; do
    for v in old new; do echo "$v $(/tmp/kc_$v $k 250000 $r 300 $isa)"; done
    for v in old new; do echo "$v $(/tmp/kc_$v $k 250000 $r 300 $isa)"; done
  done; done
  for a in "1 512 300 $isa 1" "5 512 300 $isa 1" "16 512 150 $isa 1" "1 512 200 $isa 16" "1 2048 100 $isa 1"; do
    for v in old new old new; do echo "$v $(/tmp/ac_$v $a 2>&1 | tr '\n' ' ')"; done
  done
done
