#!/usr/bin/env bash
# The first contact with a lent GPU, as one script that stays under 9 minutes:
#
#   bash bench/gpu_first_contact.sh            # on the GPU machine, from a copy of the tree
#   bash bench/gpu_first_contact.sh --dry-run  # on a CPU (CI): every step that can run there
#
# Steps: the versions found; the NVML probe (bench/nvml_probe.py); the real-NVML tests
# (pytest, when installed); the kernels' correctness and the engine's token parity, CUDA-graph
# capture with the decode-step timing, the engine's ModelRunner decode step, and the engine's
# memory budget on SmolLM2-135M's shape (sections of bench/kernels_gpu.py); then two engines
# sharing the GPU: two 4 GiB shares and two time slices, then 30/70 core shares and a pinned
# limit under an MPS daemon of its own (bench/shared_gpu.py; its dry run goes through a
# simulated GPU). It needs only the machine's own Python with torch, Triton and nvidia-ml-py
# (parity, engine and memory_budget also need transformers; the shared-GPU steps need the
# engine server's packages, and skip saying so without them); the project is imported from
# this tree, not installed.
#
# Each step writes its own log under $OUT (default ./gpu-first-contact-out), runs under its
# own timeout, and a failing step does not stop the others. The summary (pass, FAIL, TIMEOUT
# or skip per step) is printed at the end and kept in $OUT/summary.txt; the exit status is 1
# when any step failed or timed out. PYTHON picks the interpreter (default python3);
# GPU_FIRST_CONTACT_BUDGET_S the whole run's limit in seconds (default 500).
set -u

DRY_RUN=0
case "${1:-}" in
    "") ;;
    --dry-run) DRY_RUN=1 ;;
    *)
        echo "usage: bash bench/gpu_first_contact.sh [--dry-run]" >&2
        exit 2
        ;;
esac

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 2
OUT="${OUT:-$ROOT/gpu-first-contact-out}"
mkdir -p "$OUT" || exit 2
PYTHON="${PYTHON:-python3}"
if ! command -v "$PYTHON" >/dev/null 2>&1; then
    PYTHON=python
fi
BUDGET_S="${GPU_FIRST_CONTACT_BUDGET_S:-500}"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1

KERNEL_FLAGS=()
PROBE_FLAGS=(--usage)
if [ "$DRY_RUN" = 1 ]; then
    KERNEL_FLAGS=(--dry-run)
    PROBE_FLAGS=(--usage --fake e2e/fleets/sample.yaml)
fi

STARTED=$SECONDS
STEP=0
FAILED=0
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"

# run_step NAME LIMIT_S COMMAND...: runs COMMAND with its output in $OUT/NN-NAME.log, under
# the smaller of LIMIT_S and what is left of the whole run's budget.
run_step() {
    local name="$1" limit="$2"
    shift 2
    STEP=$((STEP + 1))
    local log
    log="$OUT/$(printf '%02d' "$STEP")-$name.log"
    local left=$((BUDGET_S - (SECONDS - STARTED)))
    if [ "$left" -lt "$limit" ]; then
        limit=$left
    fi
    if [ "$limit" -lt 5 ]; then
        echo "not run: the whole run's ${BUDGET_S} s budget is spent" >"$log"
        record "$name" "skip" 0 "out of time"
        return
    fi
    local cmd="$*"
    cmd="${cmd//$'\n'/ }"
    echo "== $name (limit ${limit} s): ${cmd:0:110}"
    local began=$SECONDS status
    {
        echo "\$ $* (limit ${limit} s)"
        timeout -k 10 "$limit" "$@"
    } >"$log" 2>&1
    status=$?
    local took=$((SECONDS - began))
    case "$status" in
        0) record "$name" "pass" "$took" "" ;;
        124 | 137) record "$name" "TIMEOUT" "$took" "after ${limit} s" ;;
        *) record "$name" "FAIL" "$took" "exit $status" ;;
    esac
    if [ "$status" != 0 ]; then
        FAILED=1
        echo "   last lines of $log:"
        tail -n 15 "$log" | sed 's/^/   | /'
    fi
}

record() {
    local line
    line=$(printf '%-22s %-8s %4ss  %s' "$1" "$2" "$3" "$4" | sed 's/ *$//')
    echo "$line" >>"$SUMMARY"
    echo "   $line"
}

# A step that cannot run here is recorded as skipped, with its reason in its log.
skip_step() {
    local name="$1" reason="$2"
    STEP=$((STEP + 1))
    echo "not run: $reason" >"$OUT/$(printf '%02d' "$STEP")-$name.log"
    record "$name" "skip" 0 "$reason"
}

MODE="GPU run"
if [ "$DRY_RUN" = 1 ]; then
    MODE="dry run (CPU)"
fi
echo "GPU first contact: $MODE, logs in $OUT"

run_step versions 30 "$PYTHON" -c '
import importlib.util, shutil, subprocess, sys
from bench.nvml_probe import print_versions
print("python", sys.version.replace("\n", " "), "at", sys.executable)
print_versions()
try:
    import torch
except ImportError as err:
    print("torch: missing", err)
else:
    print("torch", torch.__version__, "built for CUDA", torch.version.cuda,
          "cuda available", torch.cuda.is_available())
    for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        props = torch.cuda.get_device_properties(i)
        print(f"cuda:{i} {props.name} {props.total_memory / 2**30:.1f} GiB"
              f" sm_{props.major}{props.minor} {props.multi_processor_count} SMs")
for tool in ("pytest", "transformers", "safetensors", "grpc_tools", "grpc", "yaml"):
    print(f"{tool}:", "present" if importlib.util.find_spec(tool) else "missing")
if shutil.which("nvidia-smi"):
    print(subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=20).stdout)
else:
    print("nvidia-smi: missing")
'

run_step nvml_probe 30 "$PYTHON" -m bench.nvml_probe "${PROBE_FLAGS[@]}"

if "$PYTHON" -c 'import pytest' >/dev/null 2>&1; then
    run_step real_nvml_tests 60 "$PYTHON" -m pytest -q -p no:cacheprovider -o addopts= \
        tests/device_plugin/test_real_nvml.py
else
    skip_step real_nvml_tests "pytest is missing for $PYTHON"
fi

run_step kernels_correctness 200 "$PYTHON" -m bench.kernels_gpu ${KERNEL_FLAGS[@]+"${KERNEL_FLAGS[@]}"} \
    --sections correctness,parity
run_step cuda_graphs_decode 90 "$PYTHON" -m bench.kernels_gpu ${KERNEL_FLAGS[@]+"${KERNEL_FLAGS[@]}"} \
    --sections decode_step
run_step engine_decode 60 "$PYTHON" -m bench.kernels_gpu ${KERNEL_FLAGS[@]+"${KERNEL_FLAGS[@]}"} \
    --sections engine
run_step memory_budget 90 "$PYTHON" -m bench.kernels_gpu ${KERNEL_FLAGS[@]+"${KERNEL_FLAGS[@]}"} \
    --sections memory_budget
run_step shared_gpu_memory 150 "$PYTHON" -m bench.shared_gpu ${KERNEL_FLAGS[@]+"${KERNEL_FLAGS[@]}"} \
    --sections two_shares,time_sliced
run_step shared_gpu_mps 120 "$PYTHON" -m bench.shared_gpu ${KERNEL_FLAGS[@]+"${KERNEL_FLAGS[@]}"} \
    --sections mps_cores,pinned_limit

echo
echo "summary ($((SECONDS - STARTED)) s; logs in $OUT):"
cat "$SUMMARY"
exit "$FAILED"
