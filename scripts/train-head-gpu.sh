#!/usr/bin/env bash
# Train a drafter head on one GPU in a few minutes, with the same code `augury train` runs on a CPU.
#
#   scripts/train-head-gpu.sh [MODEL] [OUT] [MINUTES]
#
# MODEL    target name or path (default qwen2.5-coder-1.5b-instruct, pulled beforehand: nothing here downloads)
# OUT      folder for the head (default heads/gpu-eagle)
# MINUTES  the whole budget, collection included (default 12: one 15-minute GPU lease less its start)
#
# Environment: DEVICE (cuda), KIND (eagle), CORPUS (self,stdlib,stdlib-tests), MAX_BATCH (256),
# TOKENS (10000000 states to collect), PIECE (16m: the head is also written in pieces of at most this
# size, for transfers that limit file sizes), AUGURY (augury), EXTRA (more `augury train` flags, e.g.
# "--data my.jsonl").
#
# Collection first has the target write (`self`: requests from its chat template's user prefix and
# greedy answers, in waves of MAX_BATCH conversations decoded as one batch, each wave's states taken by
# prefill after it; on a GPU a short block attends in one masked call) for half the collection share, then reads
# the standard library and its test suites by batched prefill (PSF-licensed; about 8 M tokens on
# CPython 3.11, 2.3 M on a 3.12 whose test suite was installed only in part). Why the writing: a head trained
# on library states alone drafts prose badly (docs/benchmarks.md 21: 4.6 M tokens seen, held-out
# alpha1 0.65 on library text, 0.20 at position 1 on Spec-Bench). CORPUS overrides the mix. Then the
# rest of the budget trains. At the end it prints the held-out acceptance by position, the curve
# against tokens seen, and how to join the pieces again.
set -euo pipefail

MODEL=${1:-qwen2.5-coder-1.5b-instruct}
OUT=${2:-heads/gpu-eagle}
MINUTES=${3:-12}
DEVICE=${DEVICE:-cuda}
KIND=${KIND:-eagle}
TOKENS=${TOKENS:-10000000}
PIECE=${PIECE:-16m}
AUGURY=${AUGURY:-augury}
PYTHON=${PYTHON:-python3}

hours=$($PYTHON -c "import sys; m = float(sys.argv[1]); assert m > 0, 'MINUTES must be positive'; print(m / 60)" "$MINUTES")
echo "training a $KIND head for $MODEL on $DEVICE: $MINUTES minutes, up to $TOKENS tokens of states -> $OUT"

# bf16 on a GPU; wide prefill batches and training batches (a GPU is idle on 2-core sizes)
# shellcheck disable=SC2086
$AUGURY train --model "$MODEL" --kind "$KIND" --hours "$hours" --out "$OUT" --device "$DEVICE" \
    --dtype "${DTYPE:-bf16}" --offline --corpus "${CORPUS:-self,stdlib,stdlib-tests}" --corpus-tokens "$TOKENS" \
    --collect-share "${COLLECT_SHARE:-0.5}" --prefill-tokens "${PREFILL_TOKENS:-32768}" \
    --batch "${BATCH:-32}" --max-batch "${MAX_BATCH:-256}" --seq-len "${SEQ_LEN:-512}" --lr "${LR:-1e-3}" \
    --curve-at "${CURVE_AT:-200000,1000000,3000000,10000000,30000000}" --quiet ${EXTRA:-}

head="$OUT/head.safetensors"
rm -f "$head".part-*
split -b "$PIECE" -d -a 3 "$head" "$head.part-"
(cd "$OUT" && sha256sum head.safetensors > head.safetensors.sha256)

$PYTHON - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
meta = json.loads((out / "head.json").read_text())
print(f"held-out alpha by position: {meta['alpha']} (untrained {meta['alpha_untrained']}), "
      f"tau at K={len(meta['alpha'])} about {meta['tau_estimate']}")
print(f"collected {meta['data']['tokens']} tokens; tokens an hour {meta['data']['tokens_per_hour']}; "
      f"trained {meta['train']['seconds']} s on {meta['train']['tokens_seen']} tokens "
      f"({meta['train']['tokens_per_second']} tokens/s)")
for point in meta["curve"]:
    print(f"  {point['tokens_seen']:>10} tokens seen: alpha {point['alpha']}, tau {point['tau']}")
pieces = sorted(p.name for p in out.glob("head.safetensors.part-*"))
print(f"pieces: {' '.join(pieces)}; join with: cat head.safetensors.part-* > head.safetensors && "
      f"sha256sum -c head.safetensors.sha256")
EOF
