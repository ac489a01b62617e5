#!/usr/bin/env bash
# device-side: MODE=smoke (tiny target on cuda) or MODE=train (join the pieces, train, hand back the head)
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
export PYTHONPATH=/tmp/site:$PWD/src:$PWD
DEV=${DEV:-cuda}
OUTDIR=${OUT:-/tmp/out}
mkdir -p "$OUTDIR"
if [ "$MODE" = smoke ]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv 2>&1 | tail -1
  nproc; free -g | head -2; df -h /tmp | tail -1; python3 -V
  python3 -c "import sys; sys.path.insert(0,'.'); from pathlib import Path; from tests.test_collection import byte_target; print(byte_target(Path('/tmp/bt')))" || exit 4
  start=$(date +%s)
  DEVICE=$DEV DTYPE=bf16 TOKENS=20000 PIECE=64k BATCH=4 SEQ_LEN=128 PREFILL_TOKENS=4096 CURVE_AT=2000,4000 \
    AUGURY="python3 -m augury.cli" PYTHON=python3 EXTRA="--max-steps 30 --draft-vocab 200 --holdout 0.1" \
    bash scripts/train-head-gpu.sh /tmp/bt /tmp/smoke 1 2>&1 | tail -8 || exit 5
  echo "smoke seconds $(( $(date +%s) - start ))"
  exit 0
fi
if [ "$MODE" = train ]; then
  start=$(date +%s)
  cp .gpu/p17 /tmp/pc/ && cat /tmp/pc/p?? > /tmp/target.gguf && (cd /tmp && sha256sum -c "$OLDPWD/.gpu/target.sha256") || exit 6
  echo "joined in $(( $(date +%s) - start )) s"
  DEVICE=$DEV TOKENS=${TOKENS:-5000000} CURVE_AT=${CURVE_AT:-200000,1000000,3000000,6000000,10000000} \
    AUGURY="python3 $PWD/.gpu/augury_tok.py" PYTHON=python3 \
    bash scripts/train-head-gpu.sh /tmp/target.gguf /tmp/head "${MINUTES:-5}" > /tmp/train.log 2>&1
  rc=$?
  tail -40 /tmp/train.log
  cp /tmp/train.log /tmp/head/head.json "$OUTDIR"/ 2>/dev/null
  ls -la /tmp/head
  cp /tmp/head/head.safetensors.part-00[0-2] "$OUTDIR"/ 2>/dev/null
  echo "train rc $rc in $(( $(date +%s) - start )) s"
  exit $rc
fi
if [ "$MODE" = fetch ]; then
  cp /tmp/head/head.safetensors.part-00[3-9] /tmp/head/head.safetensors.sha256 "$OUTDIR"/ && ls -la "$OUTDIR"
  exit $?
fi
echo "MODE?"; exit 2
