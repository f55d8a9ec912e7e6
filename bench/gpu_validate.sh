#!/usr/bin/env bash
# Profile -> calibrate -> validate a Llama-3-8B-shaped model (bf16, seeded random weights: timing
# does not depend on weight values) on one CUDA GPU; every result lands in one folder.
#
#   bash bench/gpu_validate.sh [OUT_DIR]          (PD=1 also validates 1P1D PD on the same GPU)
#
# Installs nothing and reaches no network (weights are random; the Azure trace is
# $AZURE_TRACE, by default ../shared/data/traces beside the checkout). Sized for about 8 minutes
# on an H100/H200 class GPU: greedy check ~20 s, profile ~3 min (grid "gpu", 3 timed rounds),
# calibrate a few s, validate ~4 min (3 rates, 1 real run each, 20 s of arrivals per run). Each
# stage has its own time limit so a slow stage cannot eat the others' time; a stage that fails
# or times out leaves the earlier stages' files in place.
#
# MODEL, DTYPE, DEVICE, GRID, NUM_GPU_BLOCKS, MAX_NUM_SEQS and MAX_BATCHED override the
# defaults below (a dry run of the whole pipeline on a CPU: DEVICE=cpu MODEL=llama-50m
# DTYPE=fp32 GRID=quick NUM_GPU_BLOCKS=512 MAX_NUM_SEQS=32 MAX_BATCHED=512).
set -uo pipefail

OUT=${1:-out/gpu-validate-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.." || exit 2
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/log.txt"; }

MODEL=${MODEL:-llama-3-8b}
DTYPE=${DTYPE:-bf16}
DEVICE=${DEVICE:-cuda}
GRID=${GRID:-gpu}
# KV pool: 8192 blocks x 16 tokens x 128 KiB/token (Llama-3-8B bf16 KV) = 16 GiB per engine.
NUM_GPU_BLOCKS=${NUM_GPU_BLOCKS:-8192}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-256}
MAX_BATCHED=${MAX_BATCHED:-2048}
AZURE_TRACE=${AZURE_TRACE:-../shared/data/traces/azure2023_AzureLLMInferenceTrace_conv.csv}
[ -f "$AZURE_TRACE" ] || { log "no Azure trace at $AZURE_TRACE (set AZURE_TRACE)"; exit 2; }

if [ "$DEVICE" = cuda ] && \
        ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    log "no CUDA device: this script needs one (the CPU validation is bench/validate_cpu.py)"
    exit 2
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
kvpd version > "$OUT/versions.txt" 2>&1
git rev-parse HEAD > "$OUT/git-commit.txt" 2>/dev/null || true

log "greedy check: paged engine vs transformers generate on $DEVICE (fp32, $DTYPE)"
timeout 120 python bench/greedy_check.py --device "$DEVICE" --dtypes "fp32,$DTYPE" \
    --json "$OUT/greedy_check.json" 2>&1 | tee "$OUT/greedy_check.log"

log "profile ($MODEL, $DTYPE, grid $GRID)"
timeout 240 kvpd profile --model "$MODEL" --dtype "$DTYPE" --device "$DEVICE" --grid "$GRID" \
    --repeats 3 --out "$OUT/profile.csv" 2>&1 | tee "$OUT/profile.log"
[ -f "$OUT/profile.csv" ] || { log "profile failed or timed out"; exit 1; }

log "calibrate"
kvpd calibrate "$OUT/profile.csv" --out "$OUT/calibration.yaml" 2>&1 | tee "$OUT/calibrate.log"
[ -f "$OUT/calibration.yaml" ] || { log "calibration failed"; exit 1; }

MODES=colocated
[ "${PD:-0}" = "1" ] && MODES=colocated,pd
log "validate ($MODES, azure slice, 3 rates)"
timeout 270 kvpd validate --calibration "$OUT/calibration.yaml" --model "$MODEL" \
    --traces azure --trace-path "$AZURE_TRACE" --modes "$MODES" --fractions 0.3,0.6,0.9 \
    --duration-s 20 --min-requests 20 --max-requests 600 --repeats 1 \
    --max-num-seqs "$MAX_NUM_SEQS" --max-num-batched-tokens "$MAX_BATCHED" \
    --num-gpu-blocks "$NUM_GPU_BLOCKS" --device "$DEVICE" \
    --out "$OUT/validate" 2>&1 | tee "$OUT/validate.log"
status=${PIPESTATUS[0]}
log "done (validate exit status $status); results in $OUT"
exit "$status"
