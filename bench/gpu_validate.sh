#!/usr/bin/env bash
# Profile -> calibrate -> validate a Llama-3-8B-shaped model (bf16, seeded random weights: timing
# does not depend on weight values) on one CUDA GPU; every result lands in one folder.
#
#   bash bench/gpu_validate.sh [OUT_DIR]          (PD=1 also validates 1P1D PD on the same GPU)
#
# Installs nothing and reaches no network (weights are random, the Azure trace is read from
# /work/shared/data/traces). Sized for about 8 minutes on an H100/H200 class GPU: profile ~3 min
# (grid "gpu", 3 timed rounds), calibrate a few s, validate ~4 min (3 rates, 1 real run each,
# 20 s of arrivals per run). Each stage has its own time limit so a slow stage cannot eat the
# others' time; a stage that fails or times out leaves the earlier stages' files in place.
set -uo pipefail

OUT=${1:-out/gpu-validate-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
cd "$(dirname "$0")/.." || exit 2
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/log.txt"; }

if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    log "no CUDA device: this script needs one (the CPU validation is bench/validate_cpu.py)"
    exit 2
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
kvpd version > "$OUT/versions.txt" 2>&1
git rev-parse HEAD > "$OUT/git-commit.txt" 2>/dev/null || true

log "profile (llama-3-8b, bf16, grid gpu)"
timeout 240 kvpd profile --model llama-3-8b --dtype bf16 --device cuda --grid gpu --repeats 3 \
    --out "$OUT/profile.csv" 2>&1 | tee "$OUT/profile.log"
[ -f "$OUT/profile.csv" ] || { log "profile failed or timed out"; exit 1; }

log "calibrate"
kvpd calibrate "$OUT/profile.csv" --out "$OUT/calibration.yaml" 2>&1 | tee "$OUT/calibrate.log"
[ -f "$OUT/calibration.yaml" ] || { log "calibration failed"; exit 1; }

MODES=colocated
[ "${PD:-0}" = "1" ] && MODES=colocated,pd
log "validate ($MODES, azure slice, 3 rates)"
# KV pool: 8192 blocks x 16 tokens x 128 KiB/token (Llama-3-8B bf16 KV) = 16 GiB per engine.
timeout 270 kvpd validate --calibration "$OUT/calibration.yaml" --model llama-3-8b \
    --traces azure --modes "$MODES" --fractions 0.3,0.6,0.9 --duration-s 20 \
    --min-requests 20 --max-requests 600 --repeats 1 --max-num-seqs 256 \
    --max-num-batched-tokens 2048 --num-gpu-blocks 8192 --device cuda \
    --out "$OUT/validate" 2>&1 | tee "$OUT/validate.log"
status=${PIPESTATUS[0]}
log "done (validate exit status $status); results in $OUT"
exit "$status"
