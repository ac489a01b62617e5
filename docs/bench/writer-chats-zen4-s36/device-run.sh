#!/usr/bin/env bash
# Prepared in session 36 for a lease that was not given ("no new device machine is lent at present"):
# the device side of a 15-minute H200 lease. The 1.12 GB GGUF goes over in 18 pieces (p00 56 MiB with
# this folder's tokenizer and the gguf wheel, then 60 MiB each; docs/bench moved out of the tree while they
# travel, so that a piece and the tree fit the 64 MiB a call carries), `setup` starts a smoke run on the
# tiny byte target in the background, `piece N` copies piece N, `train` joins, checks and trains.
# device side, run from the repo root. MODE=setup (ctl to /tmp/ctl, wheels, smoke in the background) | piece N | train
set -uo pipefail
export PYTHONUNBUFFERED=1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD
PY=${PY:-python3}
DEV=${DEV:-cuda}
case "$1" in
setup)
  rm -rf /tmp/ctl && cp -r .gpu/ctl /tmp/ctl && gunzip /tmp/ctl/tok/tokenizer.json.gz || exit 3
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
  mkdir -p /tmp/pc && cp .gpu/p00 /tmp/pc/ || exit 3
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tail -1
  nproc; free -g | sed -n 2p; df -h /tmp | tail -1
  $PY -c "import sys, torch, transformers, gguf; print(sys.version.split()[0], torch.__version__, transformers.__version__)"
  setsid nohup bash /tmp/ctl/dev.sh smoke > /tmp/smoke.log 2>&1 < /dev/null &
  echo "smoke started"
  ;;
smoke)
  start=$(date +%s)
  $PY -c "from pathlib import Path; from tests.test_collection import byte_target; print(byte_target(Path('/tmp/bt')))" || exit 4
  DEVICE=$DEV DTYPE=bf16 TOKENS=20000 PIECE=64k BATCH=4 SEQ_LEN=128 PREFILL_TOKENS=4096 CURVE_AT=2000,4000 MAX_BATCH=128 \
    AUGURY="$PY -m augury.cli" PYTHON=$PY EXTRA="--max-steps 30 --draft-vocab 200 --holdout 0.1 --request-tokens 32 --answer-tokens 64" \
    bash scripts/train-head-gpu.sh /tmp/bt /tmp/smoke 1 2>&1 | tail -8
  echo "smoke rc ${PIPESTATUS[0]} seconds $(( $(date +%s) - start ))"
  ;;
piece)
  cp ".gpu/p$2" /tmp/pc/ && ls /tmp/pc | tr '\n' ' ' && echo && tail -4 /tmp/smoke.log
  ;;
train)
  start=$(date +%s)
  cp .gpu/p17 /tmp/pc/ && cat /tmp/pc/p?? > /tmp/target.gguf && (cd /tmp && sha256sum -c /tmp/ctl/target.sha256) || exit 6
  rm -rf /tmp/pc
  echo "joined in $(( $(date +%s) - start )) s"; tail -3 /tmp/smoke.log
  DEVICE=$DEV MAX_BATCH=${MAX_BATCH:-256} COLLECT_SHARE=${COLLECT_SHARE:-0.6} TOKENS=${TOKENS:-10000000} \
    CURVE_AT=${CURVE_AT:-250000,1000000,2500000,5000000,10000000} AUGURY="$PY /tmp/ctl/augury_tok.py" PYTHON=$PY \
    EXTRA="--intermediate-size 2048 --draft-vocab 16384" \
    bash scripts/train-head-gpu.sh /tmp/target.gguf /tmp/head "${MINUTES:-6}" > /tmp/train.log 2>&1
  rc=$?
  tail -30 /tmp/train.log
  mkdir -p "$OUT" && cp /tmp/train.log /tmp/head/head.json /tmp/head/head.safetensors.sha256 "$OUT"/ 2>/dev/null
  cp /tmp/head/head.safetensors.part-00[0-4] "$OUT"/ 2>/dev/null
  ls -la /tmp/head "$OUT"
  echo "train rc $rc in $(( $(date +%s) - start )) s"
  exit $rc
  ;;
*) echo "MODE?"; exit 2 ;;
esac
