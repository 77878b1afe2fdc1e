#!/usr/bin/env bash
# One call on a GPU machine: every MD GPU test (one GPU; two GPUs when there are two), the distributed
# PCG GPU tests (their step runner is the engine's segment driver), then the MD benchmarks.
# Usage, from the repository root:   OUT=/path/to/logs bash scripts/md_gpu_check.sh
# Logs (and the benchmark tables) go to $OUT (default ./.out). BENCH=0 skips the benchmarks;
# SIZES overrides the distributed benchmark's sizes (default "32000 1048576 4194304").
set -uo pipefail
OUT="${OUT:-.out}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 REQUIRE_GPU=1 NCCL_NVLS_ENABLE=0
GPUS="$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
git rev-parse --short HEAD 2>/dev/null | tee "$OUT/commit.txt"
status=0

run() {  # run NAME CMD...: the command's output in $OUT/NAME.log, its tail on screen
    local name="$1"
    shift
    "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    tail -25 "$OUT/$name.log"
    echo "== $name: exit $rc"
    [ "$rc" -eq 0 ] || status=1
}

run md_gpu_tests python3 -m pytest -q -p no:cacheprovider -rfs tests/test_md_gpu.py tests/test_md_params.py
if [ "$GPUS" -ge 2 ]; then
    export REQUIRE_MULTI_GPU=1
    run md_two_gpu_tests python3 -m pytest -q -p no:cacheprovider -rfs tests/test_md_gpu_parallel.py
    run dist_pcg_gpu_tests python3 -m pytest -q -p no:cacheprovider -rfs tests/test_dist_gpu.py
fi
if [ "${BENCH:-1}" != 0 ]; then
    run bench_md python3 scripts/bench_md.py --sizes 4000 256000 1048576 --modes while --precisions mixed \
        --out "$OUT"
    if [ "$GPUS" -ge 2 ]; then
        # shellcheck disable=SC2086 # SIZES is a list of numbers
        run bench_dist_md python3 scripts/bench_dist_md.py --gpus 1 2 --sizes ${SIZES:-32000 1048576 4194304} \
            --out "$OUT"
    fi
fi
echo "logs in $OUT; overall exit $status"
exit "$status"
