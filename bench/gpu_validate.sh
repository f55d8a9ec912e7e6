#!/usr/bin/env bash
# Profile -> calibrate -> validate a Llama-3-8B-shaped model (bf16, seeded random weights: timing
# does not depend on weight values) on one CUDA GPU; every result lands in one folder.
#
#   bash bench/gpu_validate.sh [OUT_DIR]          (PD=1 also validates 1P1D PD on the same GPU)
#
# Installs nothing and reaches no network (weights are random; the Azure trace is
# $AZURE_TRACE, by default in $KVPD_TRACES_DIR or ../shared/data/traces beside the checkout;
# a relative path is read from the checkout). Sized for about 8 minutes
# on an H100/H200 class GPU: every stage has its own limit (greedy check 60 s, profile 180 s,
# calibrate 30 s, validate 190 s, and up to 30 s for validate to report once stopped: 8.2 min
# at most), so a slow stage cannot eat the others' time, and a stage that fails or times out
# leaves the earlier stages' files in place. A validate stopped at its limit still compares
# and reports the rates whose real runs completed (kvpd validate handles SIGTERM so).
#
# Stopping it from outside (SIGTERM/SIGINT/SIGHUP, e.g. an outer `timeout`) ends the running
# stage and every process it started. Each stage runs under its own `timeout`, which puts it in
# a process group of its own that an outer `timeout` does not reach. The first run on a lent
# H200 lost all its output, most likely that way: its outer limit (540 s) was shorter than the
# stages' limits then added up to, and something still held the output pipe when the device
# call's own limit (580 s) killed everything. So a stage runs in the background and the
# script waits for it with `wait`, which a trap can interrupt; the trap passes the signal to
# the stage's `timeout`, which passes it to the stage's process group.
#
# The profile's serving probe (the calibration's serving_speed) is off by default here: it
# builds two more engines of the model, which the profile stage's 180 s may not hold for an
# 8B model; SERVING_REQUESTS=48 turns it on.
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
AZURE_TRACE=${AZURE_TRACE:-${KVPD_TRACES_DIR:-../shared/data/traces}/azure2023_AzureLLMInferenceTrace_conv.csv}
[ -f "$AZURE_TRACE" ] || { log "no Azure trace at $AZURE_TRACE (set AZURE_TRACE)"; exit 2; }

if [ "$DEVICE" = cuda ] && \
        ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    log "no CUDA device: this script needs one (the CPU validation is bench/validate_cpu.py)"
    exit 2
fi
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
kvpd version > "$OUT/versions.txt" 2>&1
git rev-parse HEAD > "$OUT/git-commit.txt" 2>/dev/null || true

stage_pid=""
stage_name=""
on_signal() {
    log "stopped from outside during stage '$stage_name': ending it"
    [ -n "$stage_pid" ] && kill -TERM "$stage_pid" 2>/dev/null && wait "$stage_pid" 2>/dev/null
    exit 143
}
trap on_signal TERM INT HUP

# run_stage NAME LIMIT_S CMD...: CMD under `timeout` (TERM at LIMIT_S, KILL $KILL_AFTER s
# later), its output in $OUT/NAME.log and on ours; returns CMD's exit status (124: timed out).
KILL_AFTER=${KILL_AFTER:-30}
run_stage() {
    stage_name=$1
    local limit=$2
    shift 2
    log "$stage_name (limit ${limit} s): $*"
    timeout -k "$KILL_AFTER" "$limit" "$@" > "$OUT/$stage_name.log" 2>&1 &
    stage_pid=$!
    tail -n +1 -f --pid="$stage_pid" "$OUT/$stage_name.log" &
    local tail_pid=$!
    wait "$stage_pid"
    local rc=$?
    stage_pid=""
    wait "$tail_pid" 2>/dev/null
    [ "$rc" = 0 ] || log "$stage_name exited with status $rc"
    return "$rc"
}

# 16-bit greedy output may legitimately diverge after a near-tie; fp32 divergence is a bug
# worth knowing about but not a reason to skip the timing stages.
run_stage greedy_check 60 python bench/greedy_check.py --device "$DEVICE" \
    --dtypes "fp32,$DTYPE" --json "$OUT/greedy_check.json"

run_stage profile 180 kvpd profile --model "$MODEL" --dtype "$DTYPE" --device "$DEVICE" \
    --grid "$GRID" --repeats 3 --serving-requests "${SERVING_REQUESTS:-0}" --out "$OUT/profile.csv"
[ -f "$OUT/profile.csv" ] || { log "no profile: stopping"; exit 1; }

run_stage calibrate 30 kvpd calibrate "$OUT/profile.csv" --out "$OUT/calibration.yaml"
[ -f "$OUT/calibration.yaml" ] || { log "no calibration: stopping"; exit 1; }

MODES=colocated
[ "${PD:-0}" = "1" ] && MODES=colocated,pd
run_stage validate 190 kvpd validate --calibration "$OUT/calibration.yaml" --model "$MODEL" \
    --traces azure --trace-path "$AZURE_TRACE" --modes "$MODES" --fractions 0.3,0.6,0.9 \
    --duration-s 20 --min-requests 20 --max-requests 600 --repeats 1 --trace-probe-s 5 \
    --max-num-seqs "$MAX_NUM_SEQS" --max-num-batched-tokens "$MAX_BATCHED" \
    --num-gpu-blocks "$NUM_GPU_BLOCKS" --device "$DEVICE" --out "$OUT/validate"
status=$?
log "done (validate exit status $status); results in $OUT"
exit "$status"
